/* bench_service_floor.c — the baseline of section (b) of zb_bench_service:
 * what a unary Report costs the plainest gRPC C-core server on this
 * machine, so the coordinator's figure can be read as a ratio against it.
 *
 * The floor server is this program again (`--floor-server PORT_FILE`), a
 * process of its own so that its CPU time is its own: one thread, one
 * completion queue, the Report method registered with its payload read
 * in the request (as the coordinator registers it), the coordinator's
 * channel arguments that change per-call work (no bandwidth-delay probes),
 * and per call only what any server must do: unpack the request, pack an
 * empty ReportResponse, send headers, message and status, see the close.
 * No hand-off to another thread, no job state, no allocation of its own
 * beyond the request's unpacking. */
#define _GNU_SOURCE
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_service.h"
#include "zb/v1/zb.pb-c.h"
#include "zb_methods.h"

extern char **environ;

enum { FLOOR_SLOTS = 128 };

/* One call slot: asked for, then answered, then asked for again. */
typedef struct floor_slot {
  grpc_call *call;
  grpc_byte_buffer *req;
  gpr_timespec deadline;
  grpc_metadata_array md;
  int cancelled;
  bool answering;
} floor_slot;

typedef struct floor_server {
  grpc_server *server;
  grpc_completion_queue *cq;
  void *method;
  floor_slot slots[FLOOR_SLOTS];
} floor_server;

static void floor_ask(floor_server *f, floor_slot *s) {
  grpc_metadata_array_init(&s->md);
  s->req = NULL;
  s->answering = false;
  grpc_server_request_registered_call(f->server, f->method, &s->call, &s->deadline, &s->md, &s->req, f->cq,
                                      f->cq, s);
}

/* Unpacks the request (a server must) and answers it with an empty
 * ReportResponse and status OK. */
static void floor_answer(floor_slot *s) {
  grpc_byte_buffer_reader rd;
  if (s->req && grpc_byte_buffer_reader_init(&rd, s->req)) {
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    Zb__V1__ReportRequest *req =
        zb__v1__report_request__unpack(NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
    if (req)
      zb__v1__report_request__free_unpacked(req, NULL);
    grpc_slice_unref(all);
    grpc_byte_buffer_reader_destroy(&rd);
  }
  Zb__V1__ReportResponse resp = ZB__V1__REPORT_RESPONSE__INIT;
  grpc_slice body = grpc_slice_malloc(zb__v1__report_response__get_packed_size(&resp));
  zb__v1__report_response__pack(&resp, GRPC_SLICE_START_PTR(body));
  grpc_byte_buffer *out = grpc_raw_byte_buffer_create(&body, 1);
  grpc_slice_unref(body);
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = out;
  ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
  ops[3].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[3].data.recv_close_on_server.cancelled = &s->cancelled;
  s->answering = true;
  grpc_call_start_batch(s->call, ops, 4, s, NULL);
  grpc_byte_buffer_destroy(out);
}

static void floor_done(floor_slot *s) {
  if (s->req)
    grpc_byte_buffer_destroy(s->req);
  grpc_metadata_array_destroy(&s->md);
  grpc_call_unref(s->call);
}

int floor_server_main(const char *port_file) {
  grpc_init();
  floor_server f = {0};
  grpc_arg args[1] = {{.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_BDP_PROBE, .value.integer = 0}};
  grpc_channel_args ch_args = {.num_args = 1, .args = args};
  f.cq = grpc_completion_queue_create_for_next(NULL);
  f.server = grpc_server_create(&ch_args, NULL);
  grpc_server_register_completion_queue(f.server, f.cq, NULL);
  f.method = grpc_server_register_method(f.server, ZB_METHOD_REPORT, NULL,
                                         GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  int port = grpc_server_add_http2_port(f.server, "127.0.0.1:0", creds);
  grpc_server_credentials_release(creds);
  if (port <= 0)
    return 1;
  grpc_server_start(f.server);
  for (int k = 0; k < FLOOR_SLOTS; k++)
    floor_ask(&f, &f.slots[k]);
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
  FILE *pf = fopen(tmp, "w");
  if (!pf || fprintf(pf, "%d\n", port) < 0 || fclose(pf) != 0 || rename(tmp, port_file) != 0)
    return 1;
  for (;;) { /* until the bench kills it */
    grpc_event ev = grpc_completion_queue_next(f.cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type != GRPC_OP_COMPLETE)
      continue;
    floor_slot *s = ev.tag;
    if (s->answering || !ev.success) {
      if (s->call)
        floor_done(s);
      floor_ask(&f, s);
    } else {
      floor_answer(s);
    }
  }
}

pid_t floor_server_start(char *addr, size_t addr_len) {
  char port_file[512];
  snprintf(port_file, sizeof port_file, "%s/floor.port", bench_dir);
  char *argv[] = {"/proc/self/exe", "--floor-server", port_file, NULL};
  pid_t pid;
  if (posix_spawn(&pid, argv[0], NULL, NULL, argv, environ) != 0)
    return -1;
  for (int t = 0; t < 1000; t++) {
    FILE *pf = fopen(port_file, "r");
    int port = 0;
    if (pf) {
      int got = fscanf(pf, "%d", &port);
      fclose(pf);
      if (got == 1 && port > 0) {
        snprintf(addr, addr_len, "127.0.0.1:%d", port);
        return pid;
      }
    }
    sleep_s(0.01);
  }
  kill(pid, SIGKILL);
  return -1;
}
