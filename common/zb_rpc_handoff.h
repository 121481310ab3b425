/* zb_rpc_handoff.h — how gRPC's completion events reach the libuv loop
 * (docs/architecture.md, Threads): one thread waits on the completion
 * queue and appends each event to a queue under a lock; the loop drains
 * the whole queue at each wake-up. The thread wakes the loop (an eventfd
 * watched by a uv_poll_t) only when the loop is not already awake for the
 * queue, so under load one wake-up carries many events. Private to the
 * gRPC glue (zb_rpc_server.c).
 */
#ifndef ZB_RPC_HANDOFF_H
#define ZB_RPC_HANDOFF_H

#include <grpc/grpc.h>
#include <stdbool.h>
#include <uv.h>

#include "zb_err.h"

typedef struct rpc_handoff rpc_handoff;

typedef struct rpc_handoff_ops {
  /* On the loop: one event (tag, success) gRPC completed, or one the loop
   * posted itself (rpc_handoff_post). */
  void (*on_event)(void *tag, int success, void *arg);
  /* On the loop, after each batch of events was handled (may be NULL). */
  void (*after_batch)(void *arg);
  /* On the loop, once: the queue shut down and every event was handed. */
  void (*on_drained)(void *arg);
  void *arg;
} rpc_handoff_ops;

/* Watches cq from a new thread and hands its events to loop. */
zb_err rpc_handoff_start(uv_loop_t *loop, grpc_completion_queue *cq, const rpc_handoff_ops *ops,
                         rpc_handoff **out, zb_diag *diag);
/* On the loop: an event for a tag that never went to gRPC (its batch was
 * refused), handled on the next pass as gRPC's own would be. */
void rpc_handoff_post(rpc_handoff *h, void *tag, int success);
/* On the loop, after on_drained: joins the thread, closes the loop's
 * handle and frees everything; closed(arg) runs when that is done. */
void rpc_handoff_close(rpc_handoff *h, void (*closed)(void *arg), void *arg);

#endif
