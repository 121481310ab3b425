/* transport_nccl_watch.h — the watchdog of one NCCL communicator
 * (transport_nccl_watch.c; docs/model.md, Transports). A blocked NCCL op is
 * woken only by its own rank's ncclCommAbort, not by a peer's death or
 * abort, so a thread of its own polls the communicator and aborts it when
 * NCCL reports an error, the stop flag rises (the coordinator released the
 * job: a rank is lost) or a group outlives the transfer timeout.
 *
 * Ownership: the watch owns the communicator from zb_nccl_watch_start on;
 * it alone aborts or destroys it. The transport's thread reaches it only
 * between zb_nccl_watch_get and zb_nccl_watch_put (the watch's lock), so
 * an abort never lands inside one of its NCCL calls.
 */
#ifndef ZB_TRANSPORT_NCCL_WATCH_H
#define ZB_TRANSPORT_NCCL_WATCH_H

#include <nccl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "zb_err.h"

typedef struct zb_nccl_watch zb_nccl_watch;

/* Starts watching comm of rank `rank` (stop may be NULL; timeout_s <= 0:
 * no deadline). NULL (diag set) when the thread cannot start; comm is then
 * still the caller's. */
zb_nccl_watch *zb_nccl_watch_start(ncclComm_t comm, int rank, const atomic_bool *stop, double timeout_s,
                                   zb_diag *diag);

/* The communicator with the watch's lock held, or NULL (lock held too)
 * once it was aborted. Always pair with zb_nccl_watch_put. */
ncclComm_t zb_nccl_watch_get(zb_nccl_watch *w);
void zb_nccl_watch_put(zb_nccl_watch *w);

/* A group was launched: its deadline runs from now; what ("to rank 1
 * (send F s0 mb2)") names it in the abort's reason. idle: it completed. */
void zb_nccl_watch_busy(zb_nccl_watch *w, const char *what); /* w NULL: nothing */
void zb_nccl_watch_idle(zb_nccl_watch *w);

/* Whether the communicator was aborted (w NULL: false); the reason into why. */
bool zb_nccl_watch_aborted(zb_nccl_watch *w, char *why, size_t len);

/* Aborts now (any thread) with why, unless it was aborted already. */
void zb_nccl_watch_abort(zb_nccl_watch *w, const char *why);

/* Stops the thread, destroys the communicator unless it was aborted, and
 * frees w (NULL: nothing). */
void zb_nccl_watch_free(zb_nccl_watch *w);

#endif
