/* zb_rpc_handoff.c — gRPC's completion events to the libuv loop, many per
 * wake-up (zb_rpc_handoff.h). An eventfd and a uv_poll_t rather than a
 * uv_async_t: libuv 1.44's async handle spins on the loop thread while the
 * sending thread is inside uv_async_send (its write included), which took
 * a sixth of the coordinator's CPU under a flood of Reports; and the
 * thread writes only when the loop is asleep, so most events cost no
 * system call at all. */
#include "zb_rpc_handoff.h"

#include <errno.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "zb_alloc.h"

typedef struct rpc_event {
  void *tag;
  int success;
} rpc_event;

typedef struct event_list {
  rpc_event *items;
  int n, cap;
} event_list;

struct rpc_handoff {
  uv_loop_t *loop;
  uv_poll_t poll;
  int efd;
  grpc_completion_queue *cq;
  rpc_handoff_ops ops;
  pthread_t thread;
  pthread_mutex_t mu;
  /* guarded by mu */
  event_list queue; /* appended by the thread, taken whole by the loop */
  bool loop_awake;  /* a wake-up is on its way or the loop is draining: no need for another */
  bool cq_done;     /* the thread saw GRPC_QUEUE_SHUTDOWN and left */
  /* the loop's: the list it drained last, swapped back in for the next
   * batch, so the steady state allocates nothing */
  event_list spare;
  bool drained_told;
  void (*closed)(void *);
  void *closed_arg;
};

static void list_add(event_list *l, void *tag, int success) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 64;
    l->items = zb_realloc(l->items, sizeof *l->items * (size_t)l->cap);
  }
  l->items[l->n++] = (rpc_event){tag, success};
}

static void wake(rpc_handoff *h) {
  uint64_t one = 1;
  while (write(h->efd, &one, sizeof one) < 0 && errno == EINTR)
    ;
}

/* Queues one event (mu held); whether the caller must wake the loop. */
static bool queue_event(rpc_handoff *h, void *tag, int success) {
  list_add(&h->queue, tag, success);
  if (h->loop_awake)
    return false;
  h->loop_awake = true;
  return true;
}

static void *cq_thread(void *arg) {
  rpc_handoff *h = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(h->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    pthread_mutex_lock(&h->mu);
    bool must_wake = false, done = ev.type == GRPC_QUEUE_SHUTDOWN;
    if (done) {
      h->cq_done = true;
      must_wake = !h->loop_awake;
      h->loop_awake = true;
    } else if (ev.type == GRPC_OP_COMPLETE) {
      must_wake = queue_event(h, ev.tag, ev.success);
    }
    pthread_mutex_unlock(&h->mu);
    if (must_wake)
      wake(h);
    if (done)
      return NULL;
  }
}

/* On the loop: takes the queue whole, handles it, and again until it is
 * empty; then the loop sleeps and the next event wakes it. */
static void on_readable(uv_poll_t *p, int status, int events) {
  (void)status, (void)events;
  rpc_handoff *h = p->data;
  uint64_t count;
  while (read(h->efd, &count, sizeof count) < 0 && errno == EINTR)
    ;
  for (;;) {
    pthread_mutex_lock(&h->mu);
    event_list batch = h->queue;
    h->queue = h->spare;
    h->queue.n = 0;
    bool done = h->cq_done;
    if (batch.n == 0)
      h->loop_awake = false;
    pthread_mutex_unlock(&h->mu);
    for (int k = 0; k < batch.n; k++)
      h->ops.on_event(batch.items[k].tag, batch.items[k].success, h->ops.arg);
    h->spare = batch;
    if (batch.n > 0 && h->ops.after_batch)
      h->ops.after_batch(h->ops.arg);
    if (batch.n == 0) {
      if (done && !h->drained_told) {
        h->drained_told = true;
        h->ops.on_drained(h->ops.arg);
      }
      return;
    }
  }
}

zb_err rpc_handoff_start(uv_loop_t *loop, grpc_completion_queue *cq, const rpc_handoff_ops *ops,
                         rpc_handoff **out, zb_diag *diag) {
  rpc_handoff *h = zb_calloc(1, sizeof *h);
  h->loop = loop;
  h->cq = cq;
  h->ops = *ops;
  h->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (h->efd < 0) {
    free(h);
    return zb_diag_set(diag, ZB_ERR_IO, "rpc: eventfd: %s", strerror(errno));
  }
  pthread_mutex_init(&h->mu, NULL);
  /* the thread first: should it fail, no loop handle exists yet to close
   * (an early write just leaves the eventfd readable for the poll) */
  int rc = pthread_create(&h->thread, NULL, cq_thread, h);
  if (rc != 0) {
    close(h->efd);
    pthread_mutex_destroy(&h->mu);
    free(h);
    return zb_diag_set(diag, ZB_ERR_IO, "rpc: cannot start the completion-queue thread: %s", strerror(rc));
  }
  uv_poll_init(loop, &h->poll, h->efd);
  h->poll.data = h;
  uv_poll_start(&h->poll, UV_READABLE, on_readable);
  *out = h;
  return ZB_OK;
}

void rpc_handoff_post(rpc_handoff *h, void *tag, int success) {
  pthread_mutex_lock(&h->mu);
  bool must_wake = queue_event(h, tag, success);
  pthread_mutex_unlock(&h->mu);
  if (must_wake)
    wake(h);
}

static void on_poll_closed(uv_handle_t *p) {
  rpc_handoff *h = p->data;
  void (*closed)(void *) = h->closed;
  void *arg = h->closed_arg;
  close(h->efd);
  pthread_mutex_destroy(&h->mu);
  free(h->queue.items);
  free(h->spare.items);
  free(h);
  if (closed)
    closed(arg);
}

void rpc_handoff_close(rpc_handoff *h, void (*closed)(void *arg), void *arg) {
  if (uv_is_closing((uv_handle_t *)&h->poll))
    return;
  pthread_join(h->thread, NULL);
  h->closed = closed;
  h->closed_arg = arg;
  uv_poll_stop(&h->poll);
  uv_close((uv_handle_t *)&h->poll, on_poll_closed);
}
