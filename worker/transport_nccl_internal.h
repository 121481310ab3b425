/* transport_nccl_internal.h — what the nccl transport's two files share
 * (docs/model.md, Transports): transport_nccl.c (connect, groups that the
 * host waits for, the life cycle) and transport_nccl_post.c (groups posted
 * without waiting: mark, group_post, order_device, room, drain). Not a
 * public header: only those two files include it. */
#ifndef ZB_TRANSPORT_NCCL_INTERNAL_H
#define ZB_TRANSPORT_NCCL_INTERNAL_H

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdint.h>

#include "transport_nccl_watch.h"
#include "zb_transport.h"

#define NCCL_POLL_NS 1000000L /* 1 ms between polls of a running group or init */
#define NCCL_MARKS 16         /* compute-stream points a posted group can wait on */

typedef struct nccl_op {
  bool is_send;
  int peer;
  zb_tag tag;
  void *buf;  /* what NCCL reads or writes: the caller's device buffer, or a bounce */
  void *host; /* the caller's buffer when it is host memory; NULL otherwise */
  size_t len;
} nccl_op;

/* A device buffer that host messages go through (by op slot, kept). */
typedef struct nccl_bounce {
  void *p;
  size_t cap;
} nccl_bounce;

typedef struct nccl_transport {
  int rank, nranks;
  int device; /* the CUDA device current at creation */
  ncclUniqueId id;
  cudaStream_t compute, comm_stream;
  cudaEvent_t ready, done; /* compute -> comm, comm -> compute */
  cudaEvent_t *ring;       /* [window]: completion of posted group k in slot k % window */
  char (*ring_what)[160];  /* [window]: that group's peers, for errors */
  int window;
  int64_t posted;                /* tickets handed out so far */
  int64_t complete;              /* groups [0, complete) are known to have completed */
  cudaEvent_t marks[NCCL_MARKS]; /* compute-stream points (mark k in slot k % NCCL_MARKS) */
  int64_t n_marks;
  const atomic_bool *stop;
  double timeout_s;
  ncclComm_t comm;      /* NULL until connect(), and after an abort */
  zb_nccl_watch *watch; /* owns comm once connected (transport_nccl_watch.h) */
  int depth;
  nccl_op *ops;
  nccl_bounce *bounce; /* cap_ops entries */
  int n_ops, cap_ops;
  zb_err failed; /* ZB_OK while healthy */
  char failure[sizeof(((zb_diag *)0)->msg)];
  char why[256]; /* nccl_why's copy */
  zb_transport_stats stats;
} nccl_transport;

/* Records the failure, aborts the communicator (peers fail promptly) and
 * drops the recorded ops; returns err set in diag. */
zb_err zbn_fail(nccl_transport *t, zb_err err, zb_diag *diag, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The first failure again, for a call after it. */
zb_err zbn_failed_before(const nccl_transport *t, zb_diag *diag);
/* Makes the transport's device current on the calling thread. */
zb_err zbn_enter(nccl_transport *t, zb_diag *diag);
/* "to rank 2 (send F s1 mb3), from rank 0 (recv B s3 mb1)" for the
 * recorded ops, as far as they fit in buf. */
const char *zbn_describe(const nccl_transport *t, char *buf, size_t len);
/* Enqueues the recorded ops as one NCCL group on the comm stream after
 * compute-stream event `after` (NULL: nothing) and records ev after it;
 * join: the compute stream waits on ev too. */
zb_err zbn_launch(nccl_transport *t, cudaEvent_t after, cudaEvent_t ev, bool join, zb_diag *diag);
/* Polls until ev fires (a launched group completed) or the group fails,
 * naming its peers (ops). */
zb_err zbn_wait_group(nccl_transport *t, cudaEvent_t ev, const char *ops, zb_diag *diag);
/* Counts the recorded ops into the stats and forgets them. */
void zbn_account(nccl_transport *t);
/* Runs the recorded ops as one group that the host and the compute stream
 * wait for, and accounts them. */
zb_err zbn_run(nccl_transport *t, zb_diag *diag);

/* The device-ordered entries (zb_transport.h), in transport_nccl_post.c. */
zb_err zbn_mark(void *self, int64_t *mark, zb_diag *diag);
zb_err zbn_group_post(void *self, int64_t after, int64_t *ticket, zb_diag *diag);
zb_err zbn_order_device(void *self, int64_t k, zb_diag *diag);
int zbn_room(void *self);
zb_err zbn_drain(void *self, zb_diag *diag);

#endif
