/* zb_rpc.c — gRPC C core glue shared by both sides (protobuf-c messages
 * to and from byte buffers, status names) and the client side: blocking
 * per-call completion queues. The server side (a completion-queue thread
 * feeding a libuv loop) is zb_rpc_server.c. See docs/architecture.md,
 * Threads. */
#include "zb_pb_strings.h"
#include "zb_rpc_internal.h"

#include <dlfcn.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_log.h"

/* ---- gRPC's start ---- */

/* Debian builds Abseil without NDEBUG, so every absl::Mutex gRPC locks
 * also checks lock order against a process-wide graph under a global lock
 * (a debug aid): a tenth of the coordinator's user time under a flood of
 * Reports. absl::SetMutexDeadlockDetectionMode(kIgnore), the default of
 * release builds, turns it off; looked up by name, so another Abseil (or
 * none) simply keeps its own setting. */
static void rpc_absl_checks_off(void) {
  void (*set_mode)(int) = (void (*)(int))dlsym(
      RTLD_DEFAULT, "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE");
  if (set_mode)
    set_mode(0); /* absl::OnDeadlockCycle::kIgnore */
}

void rpc_grpc_init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, rpc_absl_checks_off);
  grpc_init();
}

/* ---- protobuf-c <-> byte buffers ---- */

grpc_byte_buffer *rpc_pack(const ProtobufCMessage *msg) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  grpc_slice s = grpc_slice_malloc(n);
  protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s); /* the buffer holds its own reference */
  return bb;
}

/* Unpacks data[0..len) as desc, or names a string field holding a NUL
 * (nul_field, when cap) and gives NULL. */
static ProtobufCMessage *unpack_bytes(const ProtobufCMessageDescriptor *desc, ProtobufCAllocator *alloc,
                                      const uint8_t *data, size_t len, char *nul_field, size_t cap) {
  if (cap && zb_pb_string_with_nul(desc, data, len, nul_field, cap))
    return NULL;
  return protobuf_c_message_unpack(desc, alloc, len, data);
}

ProtobufCMessage *rpc_unpack_strict(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                    ProtobufCAllocator *alloc, char *nul_field, size_t cap) {
  if (cap)
    nul_field[0] = '\0';
  if (!bb)
    return NULL;
  /* a message that came in one uncompressed slice is read where it lies */
  if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
      bb->data.raw.slice_buffer.count == 1) {
    grpc_slice s = bb->data.raw.slice_buffer.slices[0];
    return unpack_bytes(desc, alloc, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), nul_field, cap);
  }
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb))
    return NULL;
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  ProtobufCMessage *msg =
      unpack_bytes(desc, alloc, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), nul_field, cap);
  grpc_slice_unref(s);
  grpc_byte_buffer_reader_destroy(&r);
  return msg;
}

ProtobufCMessage *rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                             ProtobufCAllocator *alloc) {
  return rpc_unpack_strict(bb, desc, alloc, NULL, 0);
}

static const char *const rpc_status_names[] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

const char *zb_rpc_status_name(grpc_status_code code) {
  return code >= 0 && code <= GRPC_STATUS_UNAUTHENTICATED ? rpc_status_names[code] : "UNKNOWN_STATUS";
}

/* ---- client ---- */

struct zb_rpc_client {
  grpc_channel *ch;
};

zb_rpc_client *zb_rpc_client_new(const char *target, long long max_message_bytes) {
  return zb_rpc_client_new_tls(target, max_message_bytes, NULL);
}

zb_rpc_client *zb_rpc_client_new_tls(const char *target, long long max_message_bytes, const zb_tls *tls) {
  rpc_grpc_init();
  zb_rpc_client *c = zb_calloc(1, sizeof *c);
  grpc_arg args[4] = {
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
       .value.integer = (int)max_message_bytes},
      /* reconnect fast after a coordinator restart */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, .value.integer = 100},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 1000},
      /* no bandwidth-delay probes: a worker's probe after each answer it
       * reads cost the coordinator a read and a write per heartbeat (a
       * large Assignment still gets a window of its own size) */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_BDP_PROBE, .value.integer = 0},
  };
  grpc_channel_args ch_args = {.num_args = 4, .args = args};
  grpc_ssl_pem_key_cert_pair pair = {.private_key = tls ? tls->key_pem : NULL,
                                     .cert_chain = tls ? tls->cert_pem : NULL};
  grpc_channel_credentials *creds =
      tls ? grpc_ssl_credentials_create(tls->ca_pem, &pair, NULL, NULL) : grpc_insecure_credentials_create();
  c->ch = grpc_channel_create(target, creds, &ch_args);
  grpc_channel_credentials_release(creds);
  return c;
}

void zb_rpc_client_free(zb_rpc_client *c) {
  if (!c)
    return;
  grpc_channel_destroy(c->ch);
  free(c);
  grpc_shutdown();
}

static gpr_timespec rpc_deadline(int timeout_ms) {
  if (timeout_ms <= 0)
    return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

static void rpc_cq_destroy(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
         GRPC_QUEUE_SHUTDOWN)
    ;
  grpc_completion_queue_destroy(cq);
}

/* The first four ops of every client call, unary or server-streaming:
 * send the headers, the one request and the half-close, and receive the
 * server's headers into md_init. */
static void rpc_client_open_ops(grpc_op *ops, grpc_byte_buffer *send, bool wait_for_ready,
                                grpc_metadata_array *md_init) {
  memset(ops, 0, 4 * sizeof *ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].flags = wait_for_ready ? GRPC_INITIAL_METADATA_WAIT_FOR_READY : 0;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = md_init;
}

static void rpc_copy_details(grpc_slice det, const char *error_string, char *out, size_t len) {
  if (!out || len == 0)
    return;
  size_t n = GRPC_SLICE_LENGTH(det);
  if (n > 0) {
    if (n >= len)
      n = len - 1;
    memcpy(out, GRPC_SLICE_START_PTR(det), n);
    out[n] = 0;
  } else {
    snprintf(out, len, "%s", error_string ? error_string : "");
  }
}

grpc_status_code zb_rpc_unary(zb_rpc_client *c, const char *method, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                              int timeout_ms, bool wait_for_ready, char *details, size_t details_len) {
  *resp = NULL;
  if (details && details_len)
    details[0] = 0;
  grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
  grpc_slice m = grpc_slice_from_copied_string(method);
  grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                             rpc_deadline(timeout_ms), NULL);
  grpc_slice_unref(m);
  grpc_byte_buffer *send = rpc_pack(req), *recv = NULL;
  grpc_metadata_array md_init, md_trail;
  grpc_metadata_array_init(&md_init);
  grpc_metadata_array_init(&md_trail);
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice det = grpc_empty_slice();
  const char *error_string = NULL;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  rpc_client_open_ops(ops, send, wait_for_ready, &md_init);
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &md_trail;
  ops[5].data.recv_status_on_client.status = &status;
  ops[5].data.recv_status_on_client.status_details = &det;
  ops[5].data.recv_status_on_client.error_string = &error_string;
  int tag = 0;
  if (grpc_call_start_batch(call, ops, 6, &tag, NULL) == GRPC_CALL_OK)
    grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  grpc_byte_buffer_destroy(send);
  if (status == GRPC_STATUS_OK) {
    *resp = rpc_unpack(recv, resp_desc, NULL);
    if (!*resp) {
      status = GRPC_STATUS_INTERNAL;
      snprintf(details, details_len, "the response is not a valid %s message", resp_desc->name);
    }
  } else {
    rpc_copy_details(det, error_string, details, details_len);
  }
  if (recv)
    grpc_byte_buffer_destroy(recv);
  grpc_slice_unref(det);
  gpr_free((void *)error_string);
  grpc_metadata_array_destroy(&md_init);
  grpc_metadata_array_destroy(&md_trail);
  grpc_call_unref(call);
  rpc_cq_destroy(cq);
  return status;
}

struct zb_rpc_stream {
  grpc_completion_queue *cq;
  grpc_call *call;
  int tag_start, tag_status, tag_recv; /* addresses are the tags */
  bool start_done, status_done, recv_pending, ended;
  grpc_byte_buffer *recv;
  grpc_metadata_array md_init, md_trail;
  grpc_status_code status;
  grpc_slice det;
  const char *error_string;
};

zb_rpc_stream *zb_rpc_stream_open(zb_rpc_client *c, const char *method, const ProtobufCMessage *req,
                                  int timeout_ms, bool wait_for_ready) {
  zb_rpc_stream *st = zb_calloc(1, sizeof *st);
  st->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_slice m = grpc_slice_from_copied_string(method);
  st->call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, st->cq, m, NULL,
                                      rpc_deadline(timeout_ms), NULL);
  grpc_slice_unref(m);
  grpc_metadata_array_init(&st->md_init);
  grpc_metadata_array_init(&st->md_trail);
  st->det = grpc_empty_slice();
  st->status = GRPC_STATUS_UNKNOWN;
  grpc_op sop;
  memset(&sop, 0, sizeof sop);
  sop.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  sop.data.recv_status_on_client.trailing_metadata = &st->md_trail;
  sop.data.recv_status_on_client.status = &st->status;
  sop.data.recv_status_on_client.status_details = &st->det;
  sop.data.recv_status_on_client.error_string = &st->error_string;
  if (grpc_call_start_batch(st->call, &sop, 1, &st->tag_status, NULL) != GRPC_CALL_OK)
    st->status_done = true;
  grpc_byte_buffer *send = rpc_pack(req);
  grpc_op ops[4];
  rpc_client_open_ops(ops, send, wait_for_ready, &st->md_init);
  if (grpc_call_start_batch(st->call, ops, 4, &st->tag_start, NULL) != GRPC_CALL_OK)
    st->start_done = true;
  grpc_byte_buffer_destroy(send);
  return st;
}

/* Waits for one event until deadline; false on timeout. */
static bool rpc_stream_pump(zb_rpc_stream *st, gpr_timespec deadline) {
  grpc_event ev = grpc_completion_queue_next(st->cq, deadline, NULL);
  if (ev.type != GRPC_OP_COMPLETE)
    return false;
  if (ev.tag == &st->tag_start)
    st->start_done = true;
  else if (ev.tag == &st->tag_status)
    st->status_done = true;
  else if (ev.tag == &st->tag_recv)
    st->recv_pending = false;
  return true;
}

int zb_rpc_stream_read(zb_rpc_stream *st, const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **msg,
                       int wait_ms) {
  *msg = NULL;
  if (st->ended)
    return 0;
  if (!st->recv_pending) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &st->recv;
    st->recv = NULL;
    if (grpc_call_start_batch(st->call, &op, 1, &st->tag_recv, NULL) != GRPC_CALL_OK) {
      st->ended = true;
      return 0;
    }
    st->recv_pending = true;
  }
  gpr_timespec deadline = wait_ms < 0 ? gpr_inf_future(GPR_CLOCK_MONOTONIC) : rpc_deadline(wait_ms);
  while (st->recv_pending)
    if (!rpc_stream_pump(st, deadline))
      return -1;
  if (!st->recv) {
    st->ended = true;
    return 0;
  }
  *msg = rpc_unpack(st->recv, resp_desc, NULL);
  grpc_byte_buffer_destroy(st->recv);
  st->recv = NULL;
  return *msg ? 1 : -2;
}

grpc_status_code zb_rpc_stream_status(zb_rpc_stream *st, char *details, size_t details_len) {
  while (!st->status_done)
    rpc_stream_pump(st, gpr_inf_future(GPR_CLOCK_MONOTONIC));
  rpc_copy_details(st->det, st->error_string, details, details_len);
  return st->status;
}

void zb_rpc_stream_free(zb_rpc_stream *st) {
  if (!st)
    return;
  if (!st->status_done)
    grpc_call_cancel(st->call, NULL);
  while (!st->status_done || !st->start_done || st->recv_pending)
    rpc_stream_pump(st, gpr_inf_future(GPR_CLOCK_MONOTONIC));
  if (st->recv)
    grpc_byte_buffer_destroy(st->recv);
  grpc_slice_unref(st->det);
  gpr_free((void *)st->error_string);
  grpc_metadata_array_destroy(&st->md_init);
  grpc_metadata_array_destroy(&st->md_trail);
  grpc_call_unref(st->call);
  rpc_cq_destroy(st->cq);
  free(st);
}
