/* watch_stream.c — a job's events through WatchJob for zbctl watch, from
 * the first: when the coordinator cuts the stream because this client fell
 * behind its byte budget (RESOURCE_EXHAUSTED naming after_seq; docs/wire.md,
 * WatchJob), or the connection drops (UNAVAILABLE: the coordinator's
 * kernel closes a connection that has not read for 20 s, and a network
 * can fail), a new stream takes up after the last event received, so the
 * caller sees every event once, in order. Said on stderr once per kind. A
 * connection that keeps failing with no event in between (a coordinator
 * restarting) is tried each second for WATCH_RETRY_S seconds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zb/v1/zb.pb-c.h"
#include "zb_methods.h"
#include "zbctl.h"

enum { WATCH_RETRY_S = 10 };

/* A cut that names the seq to resume after; any other RESOURCE_EXHAUSTED
 * (the streams one identity may have) is final. */
static bool cut_behind(grpc_status_code st, const char *details) {
  return st == GRPC_STATUS_RESOURCE_EXHAUSTED && strstr(details, "after_seq=") != NULL;
}

/* Reads one stream to its end from after *after, each event to on_event
 * (*after follows them). Returns its status; *got: events read. */
static grpc_status_code watch_once(zb_rpc_client *c, const char *job_id, int64_t *after,
                                   zbctl_watch_event_fn on_event, void *ctx, char *details, size_t cap,
                                   int *got) {
  Zb__V1__WatchJobRequest req = ZB__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = (char *)job_id;
  req.after_seq = *after;
  zb_rpc_stream *s = zb_rpc_stream_open(c, ZB_METHOD_WATCH_JOB, &req.base, 0, false);
  ProtobufCMessage *msg;
  int rc;
  *got = 0;
  while ((rc = zb_rpc_stream_read(s, &zb__v1__job_event__descriptor, &msg, -1)) != 0) {
    if (rc < 0)
      continue;
    const Zb__V1__JobEvent *ev = (const void *)msg;
    *after = ev->seq;
    (*got)++;
    on_event(ev, ctx);
    protobuf_c_message_free_unpacked(msg, NULL);
  }
  grpc_status_code st = zb_rpc_stream_status(s, details, cap);
  zb_rpc_stream_free(s);
  return st;
}

grpc_status_code zbctl_watch_events(zb_rpc_client *c, const char *job_id, zbctl_watch_event_fn on_event,
                                    void *ctx, char *details, size_t cap) {
  int64_t after = 0;
  bool said_cut = false, said_drop = false;
  time_t idle_since = 0; /* the first drop with no event since, 0: none */
  for (;;) {
    int got;
    grpc_status_code st = watch_once(c, job_id, &after, on_event, ctx, details, cap, &got);
    bool cut = cut_behind(st, details),
         drop = st == GRPC_STATUS_UNAVAILABLE && after > 0; /* once it had events */
    if (!drop || got > 0)
      idle_since = 0;
    else if (!idle_since)
      idle_since = time(NULL);
    if (!(cut || drop) || (idle_since && time(NULL) - idle_since > WATCH_RETRY_S))
      return st;
    if ((cut && !said_cut) || (drop && !said_drop))
      fprintf(stderr, "zbctl watch: %s (%s); resuming after event %lld\n",
              cut ? "the coordinator cut the stream" : "the connection dropped", details, (long long)after);
    said_cut |= cut;
    said_drop |= drop;
    if (got == 0)
      sleep(1); /* nothing came: the watchers' total budget is full, or the coordinator is away; a moment */
  }
}
