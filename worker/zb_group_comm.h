/* zb_group_comm.h — NCCL collectives for one stage group (docs/model.md,
 * Collectives (nccl)): all-reduce, reduce-scatter and all-gather of fp32
 * device buffers across the d data-parallel replicas of one pipeline
 * stage (global rank g = replica * p + r; the group of stage r is
 * {r, p + r, 2p + r, ...}). The cuda job's counterpart of the tcp ring
 * (zb_collective.h): same shard rule, same sum, results in the same
 * layout, so the executor treats both alike.
 *
 * Communicator: one NCCL communicator per stage group, of d ranks, made
 * from its own ncclUniqueId, separate from the job's p2p communicator
 * (zb_transport.h): NCCL requires every rank of a communicator to join
 * each collective, and the p2p one holds all p * d ranks. What the
 * coordinator must send: one id per stage group. Member 0 of each group
 * (replica 0, global rank r) makes it with zb_group_comm_unique_id (its
 * process becomes NCCL's bootstrap root for that group and must live
 * until every member has connected) and reports it; the coordinator
 * sends group r's id to the group's other members, exactly as the p2p
 * id travels today (docs/wire.md, NCCL id exchange), keyed by stage.
 *
 * Streams: the collectives run on a comm stream of the group's own, never
 * on the compute stream nor on the p2p transport's. Each call records an
 * event on the compute stream (after everything submitted so far: the
 * caller calls it right after the stage's last W, the gradients'
 * producer), makes the comm stream wait for it, enqueues the collective,
 * records a second event after it and makes the compute stream wait on
 * that (the optimizer step submitted next, the consumer, sees the
 * result). A call returns without waiting for the data (device-ordered);
 * zb_group_comm_wait blocks the host until every enqueued collective has
 * completed. Collectives complete in call order (one comm stream).
 * zb_group_comm_all_reduce_start leaves out the second wait, so compute
 * submitted after it (the stage's other W ops, another stage's work)
 * runs while the all-reduce does (docs/model.md, Data parallelism);
 * zb_group_comm_join then makes the compute stream wait for every
 * collective enqueued so far, before the first consumer (the 1/d scale,
 * the step) and before anything that rewrites the buffer (the next
 * iteration's zeroing of the gradients). Until the join the caller must
 * submit nothing that reads or writes a started collective's buffer.
 *
 * Operations (fp32; n floats; every member calls the same sequence with
 * the same n, as NCCL requires of a collective):
 *   - all-reduce: ncclAllReduce in place with ncclSum. The caller scales
 *     (1/d, or folded into its own gradient scale), as with the ring,
 *     whose zb_ring_all_reduce sums too: one contract for both transports,
 *     and the scale stays where the tcp path already applies it. Every
 *     member ends with the same bits (NCCL reduces each element once and
 *     then copies it).
 *   - reduce-scatter / all-gather: the ring's shards (zb_ring_shard: the
 *     first n % d shards one float longer), so member i ends owning
 *     [off_i, off_i + len_i) of buf exactly as over tcp. NCCL's calls need
 *     equal counts: with n % d == 0 they run in place on buf; otherwise
 *     through a padded staging buffer of d * ceil(n/d) floats owned by the
 *     group (one device copy of n floats in, one out, on the comm stream;
 *     two copies at most each way: the first n % d shards sit at the same
 *     offsets in both layouts, the rest move by one cudaMemcpy2DAsync).
 *     Padding rather than a ncclReduce/ncclBroadcast per shard: one NCCL
 *     collective per call (NCCL's tuned algorithms), at the cost of n
 *     floats of device memory for odd n only. After a reduce-scatter the
 *     rest of buf is unspecified (as the ring's partial sums are).
 *   d = 1 or n = 0 moves nothing and returns ZB_OK.
 *
 * Failure: a wait that lasts timeout_s (the job's transfer_timeout_s,
 * counted from the start of the wait, as NCCL gives no progress figure)
 * fails naming the group and the collective; a watchdog thread
 * (transport_nccl_watch.h) aborts the communicator when NCCL reports an
 * error, the stop flag rises (the coordinator released the job: a rank
 * was lost) or that deadline passes, since a rank blocked in a collective
 * is woken only by its own ncclCommAbort. zb_group_comm_abort does the
 * same on purpose (the executor: an iteration failed, a rank is lost).
 * Any failure poisons the group: every later call returns the first
 * error. Errors begin with the group's name, "stage 1's group (member 0
 * of 2, ranks 1 3)", and name the NCCL or CUDA call that failed and, when
 * NCCL's last error says, the peer.
 *
 * Results: zb_err from lib/zb_err.h. ZB_ERR_INVALID_ARG: a bad size,
 * index, buffer or id, a call before connect; ZB_ERR_IO: NCCL or CUDA
 * failed, a timeout, the stop flag ("stopped"), an abort.
 *
 * Ownership: zb_group_comm_new returns a group the caller owns and frees
 * with zb_group_comm_free (NULL: no-op), which destroys the communicator
 * (or aborts it when a collective is still in flight: it never blocks).
 * The config and its ranks array are copied; the stop flag and the
 * compute stream are borrowed and must outlive the group. Buffers must be
 * device memory, stay valid and unwritten by compute work not ordered
 * after the collective until it completes. One thread uses a group at a
 * time (zb_group_comm_abort included); the stop flag may be raised from
 * any.
 */
#ifndef ZB_GROUP_COMM_H
#define ZB_GROUP_COMM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "zb_err.h"

typedef struct zb_group_comm zb_group_comm;

typedef struct zb_group_comm_config {
  int32_t stage;           /* the pipeline stage the group reduces (names it) */
  int size;                /* d: members, >= 1 */
  int index;               /* this member's index (its replica), 0..size-1 */
  const int *ranks;        /* [size]: member i's global rank, for errors; NULL: not named */
  uint8_t unique_id[128];  /* the group's ncclUniqueId, from member 0's zb_group_comm_unique_id */
  void *compute_stream;    /* the cudaStream_t to order after and before; NULL: the legacy default */
  const atomic_bool *stop; /* may be NULL; borrowed */
  double timeout_s;        /* bounds connect and every host wait (<= 0: none; stop still works) */
} zb_group_comm_config;

/* ncclGetUniqueId into out, for member 0 of a group (see Communicator).
 * ZB_ERR_IO when NCCL fails. */
zb_err zb_group_comm_unique_id(uint8_t out[128], zb_diag *diag);

/* Creates the group's comm stream and events on the current CUDA device
 * (the compute device); the communicator is made by connect. Does not
 * block. ZB_ERR_INVALID_ARG for a bad size or index, ZB_ERR_IO when CUDA
 * refuses. */
zb_err zb_group_comm_new(const zb_group_comm_config *cfg, zb_group_comm **out, zb_diag *diag);

/* Joins the group's communicator (non-blocking ncclCommInitRankConfig,
 * polled), bounded by timeout_s and the stop flag; a second call is a
 * no-op. Blocks until every member has joined. */
zb_err zb_group_comm_connect(zb_group_comm *g, zb_diag *diag);

/* Enqueue the collective on buf's n floats after the compute stream's
 * work so far, and make the compute stream wait for it (see Streams). Do
 * not block (beyond a staging buffer's growth, which first waits for the
 * collectives in flight). */
zb_err zb_group_comm_all_reduce(zb_group_comm *g, float *buf, size_t n, zb_diag *diag);
zb_err zb_group_comm_reduce_scatter(zb_group_comm *g, float *buf, size_t n, zb_diag *diag);
zb_err zb_group_comm_all_gather(zb_group_comm *g, float *buf, size_t n, zb_diag *diag);

/* The all-reduce without the compute stream's wait for it (see Streams):
 * the caller calls zb_group_comm_join before any consumer. Does not
 * block, as zb_group_comm_all_reduce. */
zb_err zb_group_comm_all_reduce_start(zb_group_comm *g, float *buf, size_t n, zb_diag *diag);

/* Makes the compute stream wait for every collective enqueued so far (a
 * device-side wait: the host goes on). A no-op when none is in flight.
 * ZB_ERR_IO when CUDA refuses or the group failed before. */
zb_err zb_group_comm_join(zb_group_comm *g, zb_diag *diag);

/* Blocks until every enqueued collective has completed, one fails, the
 * timeout passes or the stop flag is raised. */
zb_err zb_group_comm_wait(zb_group_comm *g, zb_diag *diag);

/* Poisons the group on purpose: aborts the communicator (the other
 * members then fail by their watchdogs) and makes every later call fail
 * with why. A no-op once failed. Does not block. */
void zb_group_comm_abort(zb_group_comm *g, const char *why);

/* "stage 1's group (member 0 of 2, ranks 1 3)": what errors begin with. */
const char *zb_group_comm_name(const zb_group_comm *g);

void zb_group_comm_free(zb_group_comm *g);

#endif
