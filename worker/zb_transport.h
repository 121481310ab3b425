/* zb_transport.h — point-to-point transports behind one vtable
 * (docs/model.md, Transports): tcp (host memory over sockets) and nccl
 * (device memory through NCCL). The semantics follow NCCL's so the
 * executor does not care which one it has:
 *   - connect() once per job (ncclCommInitRank for nccl); it is additive, so
 *     a plan update that adds peers calls it again with the new set.
 *   - send()/recv() of one tagged message of len bytes to/from a peer rank.
 *     Outside a group each call blocks until its message is through.
 *   - group_start() ... group_end() (ncclGroupStart/End): sends and receives
 *     posted in between are only recorded; group_end() progresses all of
 *     them together and returns when every one has completed. Posting a
 *     step's sends and receives in one group is what makes the lowered
 *     schedules deadlock-free under blocking semantics (zb_lower.h). Calls
 *     to one peer in one direction complete in the order they were posted
 *     (NCCL: "executed in order"). Groups nest; the outermost end runs them.
 *     Buffers must stay valid until group_end() returns.
 *   - Tags: every message carries (kind F, B or REDUCE_GRAD, sending stage,
 *     microbatch or collective number)
 *     and its length; the receiver states what it expects. tcp sends them
 *     and a mismatch is an error naming both, never a silent corruption;
 *     NCCL carries no tags, so nccl relies on the two ranks' lists agreeing
 *     (the planner validates them) and checks what it can locally.
 *
 * Device-ordered transports (nccl; zb_transport_device_ordered): the
 * executor may close a group with zb_transport_group_post instead of
 * group_end. The group is then enqueued on the device, ordered after a
 * point of the compute stream that zb_transport_mark recorded (its sends'
 * producers), and the call returns at once with a ticket; zb_transport_order_device(ticket) makes the compute
 * stream wait for that group (a consumer op of a receive), and zb_transport_drain blocks the host until every
 * posted group has completed. Groups complete in posting order (one comm stream). At most a window of groups
 * is in flight: posting one more first waits on the host for the oldest. Buffers must stay valid, and
 * unwritten by compute, until the group has completed (a later drain, or a compute op ordered after it).
 * Host-blocking transports (tcp) leave these NULL and keep group_end only (docs/model.md, Transports;
 * docs/schedules.md, Execution model).
 *
 * Failure and cancellation: a failed or cancelled call poisons the
 * transport, like ncclCommAbort: it shuts down every connection at once, so
 * peers blocked on this rank fail promptly too (naming this rank) instead of
 * hanging, and every later call returns the first failure again. Every wait
 * checks the stop flag at least every 100 ms. Errors name the peer rank.
 *
 * Results: zb_err from lib/zb_err.h. ZB_ERR_INVALID_ARG: bad rank, address
 * or size, peer not connected; ZB_ERR_INVALID_SCHEDULE: a message's tag or
 * length differs from what the receiver expected (the two ranks' lists
 * disagree); ZB_ERR_PARSE: a peer spoke something other than this protocol;
 * ZB_ERR_IO: the network failed: a peer closed or reset, a connect deadline
 * passed, no progress within the idle timeout, or "stopped" (the stop flag
 * was raised; the caller that raised it knows it cancelled).
 *
 * Ownership: a zb_transport is created by a constructor (zb_transport_tcp_new)
 * and owned by the caller, who frees it with zb_transport_free() (NULL is a
 * no-op), which closes every socket. Strings and arrays passed in are
 * copied; the stop flag is borrowed and must outlive the transport. One
 * thread uses a transport at a time; the stop flag may be raised from any.
 */
#ifndef ZB_TRANSPORT_H
#define ZB_TRANSPORT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "zb_schedule.h"

/* What a message carries: kind ZB_OP_F (an activation, SEND_F/RECV_F) or
 * ZB_OP_B (a gradient, SEND_B/RECV_B), the stage that sent it and the
 * microbatch. A RECV_F of stage s expects (F, s-1, mb); a RECV_B of stage s
 * expects (B, s+1, mb). The ring collectives (zb_collective.h) send kind
 * ZB_OP_REDUCE_GRAD with their group's stage and collective number in mb;
 * no other kind is accepted. */
typedef struct zb_tag {
  zb_op kind;
  int32_t stage;
  int32_t mb;
} zb_tag;

/* Counters since creation; payload bytes only (no headers). */
typedef struct zb_transport_stats {
  int64_t bytes_sent, bytes_received;
  int64_t messages_sent, messages_received;
} zb_transport_stats;

typedef struct zb_transport_ops {
  const char *name; /* "tcp", "nccl" */
  const char *(*address)(void *self);
  zb_err (*connect)(void *self, const char *const *addresses, const bool *peers, double timeout_s,
                    zb_diag *diag);
  void (*group_start)(void *self);
  zb_err (*send)(void *self, int peer, zb_tag tag, const void *buf, size_t len, zb_diag *diag);
  zb_err (*recv)(void *self, int peer, zb_tag tag, void *buf, size_t len, zb_diag *diag);
  zb_err (*group_end)(void *self, zb_diag *diag);
  void (*stats)(void *self, zb_transport_stats *out);
  /* Device-ordered transports only; NULL on host-blocking ones. */
  zb_err (*mark)(void *self, int64_t *mark, zb_diag *diag);
  zb_err (*group_post)(void *self, int64_t after, int64_t *ticket, zb_diag *diag);
  zb_err (*order_device)(void *self, int64_t ticket, zb_diag *diag);
  zb_err (*drain)(void *self, zb_diag *diag);
  int (*room)(void *self);
  bool (*failed_by_peer)(void *self); /* NULL: never tells */
  void (*abort)(void *self, const char *why);
  void (*free)(void *self);
} zb_transport_ops;

typedef struct zb_transport {
  const zb_transport_ops *ops;
  void *self;
} zb_transport;

/* The address peers reach this rank at ("127.0.0.1:40123"; a wildcard bind
 * reports the wildcard, which the daemon replaces with its host name), or
 * "" when the transport has none (nccl). Owned by t. Does not block. */
static inline const char *zb_transport_address(zb_transport *t) {
  return t->ops->address(t->self);
}

/* Connects to every rank q with peers[q] true (peers NULL: all other ranks);
 * addresses[q] is q's address (entries of other ranks may be NULL). Of two
 * ranks the lower dials and the higher accepts, so each pair gets one
 * connection; a handshake carries rank, rank count and session. Dials are
 * retried with backoff until the deadline for peers not yet listening.
 * Blocks until every peer is connected, timeout_s passes (<= 0: no deadline)
 * or the stop flag is raised. Peers already connected are skipped. */
static inline zb_err zb_transport_connect(zb_transport *t, const char *const *addresses, const bool *peers,
                                          double timeout_s, zb_diag *diag) {
  return t->ops->connect(t->self, addresses, peers, timeout_s, diag);
}

/* Opens a group: later send/recv calls are recorded until the matching
 * zb_transport_group_end(). Does not block. */
static inline void zb_transport_group_start(zb_transport *t) {
  t->ops->group_start(t->self);
}

/* Sends len bytes of buf to rank peer tagged tag. Blocks until written
 * outside a group; inside one it only records (buf must stay valid until
 * group_end returns). */
static inline zb_err zb_transport_send(zb_transport *t, int peer, zb_tag tag, const void *buf, size_t len,
                                       zb_diag *diag) {
  return t->ops->send(t->self, peer, tag, buf, len, diag);
}

/* Receives the next message from rank peer into buf, which must carry tag
 * and be len bytes long. Blocking and grouping as for send. */
static inline zb_err zb_transport_recv(zb_transport *t, int peer, zb_tag tag, void *buf, size_t len,
                                       zb_diag *diag) {
  return t->ops->recv(t->self, peer, tag, buf, len, diag);
}

/* Closes a group; the outermost close blocks until every recorded send and
 * receive has completed, one fails, or the stop flag is raised. */
static inline zb_err zb_transport_group_end(zb_transport *t, zb_diag *diag) {
  return t->ops->group_end(t->self, diag);
}

/* Whether t orders its groups on the device (nccl): group_post,
 * order_device and drain work. False for host-blocking transports (tcp).
 * Does not block. */
static inline bool zb_transport_device_ordered(const zb_transport *t) {
  return t->ops->group_post != NULL;
}

/* Records a point on the compute stream (after the work submitted so far:
 * a send's producer) and sets *mark to its number. Device-ordered
 * transports only. Does not block. */
static inline zb_err zb_transport_mark(zb_transport *t, int64_t *mark, zb_diag *diag) {
  return t->ops->mark(t->self, mark, diag);
}

/* Closes the outermost group like group_end, but only enqueues it on the
 * device, ordered after compute point `after` (zb_transport_mark; -1:
 * after nothing of the compute stream, as for receives only), and sets
 * *ticket to its number (increasing from 0 over t's life). Blocks only to
 * keep the window: while the window's worth of groups is in flight, until
 * the oldest has completed (timeout and stop flag as for group_end). A
 * group with host buffers runs as with group_end (it has completed on
 * return). Device-ordered transports only. */
static inline zb_err zb_transport_group_post(zb_transport *t, int64_t after, int64_t *ticket, zb_diag *diag) {
  return t->ops->group_post(t->self, after, ticket, diag);
}

/* Makes the compute stream wait for posted group `ticket` before any work
 * submitted after this call (a receive's consumer). Does not block. */
static inline zb_err zb_transport_order_device(zb_transport *t, int64_t ticket, zb_diag *diag) {
  return t->ops->order_device(t->self, ticket, diag);
}

/* How many groups group_post takes now without waiting for the window
 * (completed groups are found by a query, never a wait). Device-ordered
 * transports only. Does not block. */
static inline int zb_transport_room(zb_transport *t) {
  return t->ops->room(t->self);
}

/* Blocks until every posted group has completed, one fails, the timeout
 * passes or the stop flag is raised. */
static inline zb_err zb_transport_drain(zb_transport *t, zb_diag *diag) {
  return t->ops->drain(t->self, diag);
}

/* Fills *out with the counters. Does not block. */
static inline void zb_transport_stats_get(zb_transport *t, zb_transport_stats *out) {
  t->ops->stats(t->self, out);
}

/* Whether t's first failure was a peer closing or resetting its
 * connection: this rank only saw another's failure (or the network's),
 * which the coordinator takes as the weaker reason for the job's
 * (docs/wire.md, Reports). False while t is healthy, and for a transport
 * that cannot tell (nccl). Does not block. */
static inline bool zb_transport_failed_by_peer(zb_transport *t) {
  return t->ops->failed_by_peer && t->ops->failed_by_peer(t->self);
}

/* Poisons t on purpose (ncclCommAbort): shuts every connection down so
 * peers waiting on this rank fail promptly, and makes every later call fail
 * with why. A no-op when t failed already. The executor calls it when an
 * iteration fails for any reason (a backend error, the stop flag). Does not
 * block. */
static inline void zb_transport_abort(zb_transport *t, const char *why) {
  t->ops->abort(t->self, why);
}

/* Transport name ("tcp", ...). */
static inline const char *zb_transport_name(const zb_transport *t) {
  return t->ops->name;
}

/* Closes every connection and frees t; NULL is a no-op. Does not block. */
static inline void zb_transport_free(zb_transport *t) {
  if (t) {
    t->ops->free(t->self);
    free(t);
  }
}

/* Formats a tag as "F s2 mb5" into buf (NUL-terminated); returns buf. */
const char *zb_tag_format(zb_tag tag, char *buf, size_t len);

/* ---- tcp: non-blocking sockets progressed by poll() ---- */

typedef struct zb_tcp_config {
  int rank, nranks;
  /* "host:port" to listen on; port 0 picks a free one; host empty, "*" or
   * "0.0.0.0" for every interface; "[::1]:0" for IPv6. Ignored when
   * has_listener is set. */
  const char *listen;
  /* A socket from zb_tcp_listen that the caller keeps across transports
   * (a worker's data port, bound once for its life, so no other process
   * can take the port between two jobs). Borrowed: never closed here. */
  bool has_listener;
  int listener_fd;
  /* Both ends of a connection must agree (a job/plan id), so a connection
   * left over from another job is refused in the handshake. */
  uint64_t session;
  /* The job's data secret (the coordinator sends it with each rank's
   * assignment): the handshake proves both ends hold it without sending
   * it. NULL: the session's 8 bytes stand in (tests; no protection).
   * Copied; at most 64 bytes. */
  const unsigned char *secret;
  size_t secret_len;
  const atomic_bool *stop; /* may be NULL; borrowed */
  /* A group or a handshake that moves no byte for this long fails with
   * ZB_ERR_IO (<= 0: wait as long as it takes; the stop flag still works). */
  double idle_timeout_s;
} zb_tcp_config;

/* Binds and listens on the first resolved address of addr ("host:port",
 * as zb_tcp_config.listen) that works: *fd is a non-blocking listening
 * socket the caller owns; *port its bound port. ZB_ERR_INVALID_ARG for a
 * bad address, ZB_ERR_IO when it cannot be bound. */
zb_err zb_tcp_listen(const char *addr, int *fd, int *port, zb_diag *diag);

/* Creates a tcp transport listening on cfg->listen (bound before it
 * returns; zb_transport_address() tells where). Caller owns *out. Does not
 * block (name resolution of a host name aside). ZB_ERR_INVALID_ARG for a
 * bad rank or address, ZB_ERR_IO when the address cannot be bound. */
zb_err zb_transport_tcp_new(const zb_tcp_config *cfg, zb_transport **out, zb_diag *diag);

/* ---- nccl: ncclSend/ncclRecv on a comm stream of its own ---- */

/* The nccl transport (transport_nccl.c; docs/model.md, Transports) moves
 * device buffers (the cuda backend's) with NCCL point-to-point; it never
 * touches their bytes. Tags cannot travel in NCCL: only the local checks
 * (peer, length) are made here, the tag check is the tcp transport's only;
 * both ranks' lists come from one lowered plan, so they agree. Each
 * group's ops are ordered after the compute stream's work (an event). A
 * group closed by group_end is waited for on the host and the compute
 * stream waits for it too; one closed by group_post records an event of
 * its own (a ring of `window`), which order_device makes the compute
 * stream wait on and drain waits for. A host wait that lasts timeout_s
 * fails naming the group's peers; any failure ncclCommAborts. */
typedef struct zb_nccl_config {
  int rank, nranks;
  uint8_t unique_id[128];  /* an ncclUniqueId from rank 0's zb_transport_nccl_unique_id */
  void *compute_stream;    /* the cudaStream_t to order after; NULL: the legacy default stream */
  const atomic_bool *stop; /* may be NULL; borrowed */
  double timeout_s;        /* bounds init and every host wait (<= 0: none; the stop flag still works) */
  int window;              /* posted groups in flight at most (group_post); <= 0: ZB_NCCL_WINDOW */
} zb_nccl_config;

#define ZB_NCCL_WINDOW 8

/* Creates an nccl transport: its comm stream and events (the caller has
 * made the compute device current). The communicator is made by connect().
 * ZB_ERR_INVALID_ARG for a bad rank, ZB_ERR_IO when CUDA refuses. */
zb_err zb_transport_nccl_new(const zb_nccl_config *cfg, zb_transport **out, zb_diag *diag);

/* ncclGetUniqueId into out (rank 0 only; the calling process becomes
 * NCCL's bootstrap root and must live until every rank has connected).
 * ZB_ERR_IO when NCCL fails. */
zb_err zb_transport_nccl_unique_id(uint8_t out[128], zb_diag *diag);

#endif
