/* nccl_standin.h — the NCCL stand-in's private parts (test-only; docs/model.md,
 * The CPU stand-in), shared by nccl_standin.c (communicators, errors),
 * nccl_standin_p2p.c (groups, send and receive), nccl_standin_coll.c (the
 * collectives) and nccl_standin_boot.c (unique ids, the rendezvous root and
 * the joining of a rank).
 *
 * A communicator of rank r is a tcp transport (worker/zb_transport.h) to
 * every other rank: its framing, ordering per peer and direction, idle
 * timeout and stop flag are the stand-in's p2p engine. One group of NCCL
 * calls on one communicator becomes one stream item (standin_enqueue) that
 * runs one transport group, so the calls progress together as in NCCL;
 * each collective is one item of its own.
 *
 * The id (ncclUniqueId, 128 bytes): bytes 0..111 are the real libnccl's id
 * (NCCL 2.28 fills bytes 0..35 at most: an 8-byte magic and a socket
 * address; checked on this machine) or random bytes when the library
 * cannot be loaded; bytes 112..127 are the stand-in's rendezvous:
 *   "ZBSTNDIN" | IPv4 address (4, network order) | port (2, network order) | 0 0
 * The transport session of every rank is the id's first 8 bytes.
 *
 * Locking: a communicator's mutex guards its state; the thread that runs
 * a group holds no lock while it moves data (ncclCommAbort raises the
 * abort flag, which the transport sees within 100 ms).
 */
#ifndef ZB_NCCL_STANDIN_H
#define ZB_NCCL_STANDIN_H

#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "zb_transport.h"

#define NCCLSI_TAIL 112 /* first byte of the stand-in's part of the id */
#define NCCLSI_MAGIC "ZBSTNDIN"

struct ncclComm {
  int rank, nranks;
  uint64_t session;
  ncclUniqueId id;
  atomic_bool aborted; /* the transport's stop flag */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;           /* the user's handle and every queued group */
  bool running;       /* a group is moving data through tp */
  bool init_running;  /* the joining thread has not finished */
  bool init_joinable; /* init_thread is still to be joined */
  pthread_t init_thread;
  ncclResult_t async; /* ncclInProgress while joining; the first error after */
  char last[256];     /* the message of that error */
  zb_transport *tp;   /* the data; NULL until joined and after abort/destroy */
  /* The acknowledgements, on connections of their own: on tp they would
   * queue behind (or ahead of) the peer's data of another group, which
   * NCCL's independent send and receive channels never wait for. */
  zb_transport *ack;
};

/* Records msg as comm's error (the first one sticks) or, comm NULL, as the
 * process's last error; returns res. */
ncclResult_t ncclsi_error(ncclComm_t comm, ncclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The stand-in's per-message timeout (ZB_STANDIN_NCCL_TIMEOUT_MS, default
 * 10000 ms), in seconds. */
double ncclsi_timeout_s(void);

/* ZB_STANDIN_NCCL_PEER_LOSS=hang: a peer's lost connection records no
 * error (NCCL over shared memory or NVLink); else ncclRemoteError (NCCL
 * over sockets). Either way the op stays blocked until the own abort. */
bool ncclsi_peer_loss_silent(void);

/* Joins comm to its communicator (rendezvous, then a connection to every
 * other rank); the body of the init thread. Sets comm->async. */
void *ncclsi_join(void *comm);

/* Bytes of one element of dt (0: not a datatype), and its name. */
size_t ncclsi_dt_size(ncclDataType_t dt);
const char *ncclsi_dt_name(int dt);

/* Drops one reference; the last frees comm. Call without comm->mu. */
void ncclsi_unref(ncclComm_t comm);

/* Sleeps the link delay (ZB_STANDIN_NCCL_DELAY_US; nccl_standin_p2p.c). */
void ncclsi_link_delay(void);

/* What NCCL's kernels do after a failure: they stay where they are, so
 * the stream does not move on, until this rank's own ncclCommAbort. */
void ncclsi_stuck(ncclComm_t comm);

/* One stream item's work on communicator c (the p2p group's and the
 * collective's alike): unless c is aborted or failed, marks c running,
 * meets the peers on the credit transport (meet), waits the link delay,
 * moves the data (move), and on a failure names it on c (failed) and
 * blocks the stream as NCCL does (ncclsi_stuck); then clears running. */
typedef struct ncclsi_item_fns {
  zb_err (*meet)(zb_transport *ack, const void *item, zb_diag *d);
  zb_err (*move)(zb_transport *tp, const void *item, zb_diag *d);
  void (*failed)(const void *item, zb_err err, const char *msg);
} ncclsi_item_fns;
void ncclsi_run_item(ncclComm_t c, const void *item, const ncclsi_item_fns *fns);

/* Whether the calling thread has a group open (ncclGroupStart). */
bool ncclsi_grouping(void);

/* The collectives the calling thread's group deferred
 * (nccl_standin_coll.c): enqueued in call order (run true, at the
 * outermost ncclGroupEnd) or dropped (a failed ncclGroupEnd). Returns the
 * first enqueueing error. */
ncclResult_t ncclsi_coll_flush(bool run);

#endif
