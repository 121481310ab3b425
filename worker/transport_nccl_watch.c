/* transport_nccl_watch.c — the watchdog thread of one NCCL communicator
 * (transport_nccl_watch.h has the contract; docs/model.md, Transports).
 *
 * Every WATCH_POLL_MS it takes the lock and aborts the communicator when
 * ncclCommGetAsyncError reports an error (NCCL's socket transport says
 * ncclRemoteError when a peer's process exits), when the stop flag is up
 * (the worker was released: the coordinator found a rank of the job lost,
 * which NCCL over shared memory or NVLink never reports), or when the
 * launched group has run past the transfer timeout. ncclCommAbort is what
 * makes NCCL's blocked kernels return, so the stream the executor waits on
 * moves again and the job fails with the reason recorded here.
 */
#include "transport_nccl_watch.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "zb_alloc.h"
#include "zb_clock.h"

#define WATCH_POLL_MS 20 /* an abort lands within this of its cause */

struct zb_nccl_watch {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  ncclComm_t comm; /* NULL once aborted */
  int rank;
  const atomic_bool *stop;
  double timeout_s;
  bool quit;
  int64_t busy_ns; /* when the running group was launched; 0: none */
  char what[160];  /* that group */
  char why[256];   /* the abort's reason */
};

/* Aborts comm with the reason; call with the lock held. */
static void watch_abort_locked(zb_nccl_watch *w, const char *why) {
  if (!w->comm)
    return;
  snprintf(w->why, sizeof w->why, "%s", why);
  ncclCommAbort(w->comm);
  w->comm = NULL;
}

/* One look at the communicator; call with the lock held. */
static void watch_check(zb_nccl_watch *w) {
  char why[256];
  ncclResult_t async = ncclSuccess;
  if (w->stop && atomic_load(w->stop)) {
    snprintf(why, sizeof why, "stopped (stop flag raised: the job was released)%s%s",
             w->busy_ns ? " while waiting for group " : "", w->busy_ns ? w->what : "");
    watch_abort_locked(w, why);
    return;
  }
  if (ncclCommGetAsyncError(w->comm, &async) == ncclSuccess && async != ncclSuccess &&
      async != ncclInProgress) {
    snprintf(why, sizeof why, "%s: %s%s%s", ncclGetErrorString(async), ncclGetLastError(w->comm),
             w->busy_ns ? "; group " : "", w->busy_ns ? w->what : "");
    watch_abort_locked(w, why);
    return;
  }
  if (w->busy_ns && w->timeout_s > 0 && (double)(zb_clock_ns() - w->busy_ns) * 1e-9 > w->timeout_s) {
    snprintf(why, sizeof why, "group %s did not complete within %g s (transfer_timeout_s)", w->what,
             w->timeout_s);
    watch_abort_locked(w, why);
  }
}

static void *watch_main(void *arg) {
  zb_nccl_watch *w = arg;
  pthread_mutex_lock(&w->mu);
  while (!w->quit && w->comm) {
    watch_check(w);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += WATCH_POLL_MS * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    while (!w->quit && pthread_cond_timedwait(&w->cv, &w->mu, &until) != ETIMEDOUT)
      ;
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

zb_nccl_watch *zb_nccl_watch_start(ncclComm_t comm, int rank, const atomic_bool *stop, double timeout_s,
                                   zb_diag *diag) {
  zb_nccl_watch *w = zb_calloc(1, sizeof *w);
  w->comm = comm;
  w->rank = rank;
  w->stop = stop;
  w->timeout_s = timeout_s;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&w->mu, NULL);
  if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
    zb_diag_set(diag, ZB_ERR_IO, "nccl: rank %d: cannot start the communicator's watchdog thread", rank);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
    return NULL;
  }
  return w;
}

ncclComm_t zb_nccl_watch_get(zb_nccl_watch *w) {
  pthread_mutex_lock(&w->mu);
  return w->comm;
}

void zb_nccl_watch_put(zb_nccl_watch *w) {
  pthread_mutex_unlock(&w->mu);
}

void zb_nccl_watch_busy(zb_nccl_watch *w, const char *what) {
  if (!w)
    return;
  pthread_mutex_lock(&w->mu);
  w->busy_ns = zb_clock_ns();
  snprintf(w->what, sizeof w->what, "%s", what);
  pthread_mutex_unlock(&w->mu);
}

void zb_nccl_watch_idle(zb_nccl_watch *w) {
  if (!w)
    return;
  pthread_mutex_lock(&w->mu);
  w->busy_ns = 0;
  pthread_mutex_unlock(&w->mu);
}

bool zb_nccl_watch_aborted(zb_nccl_watch *w, char *why, size_t len) {
  if (!w)
    return false;
  pthread_mutex_lock(&w->mu);
  bool gone = !w->comm;
  if (gone && why)
    snprintf(why, len, "%s", w->why);
  pthread_mutex_unlock(&w->mu);
  return gone;
}

void zb_nccl_watch_abort(zb_nccl_watch *w, const char *why) {
  pthread_mutex_lock(&w->mu);
  watch_abort_locked(w, why);
  pthread_mutex_unlock(&w->mu);
}

void zb_nccl_watch_free(zb_nccl_watch *w) {
  if (!w)
    return;
  pthread_mutex_lock(&w->mu);
  w->quit = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  if (w->comm)
    ncclCommDestroy(w->comm); /* every group completed: nothing is pending */
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  free(w);
}
