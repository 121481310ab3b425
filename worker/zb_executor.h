/* zb_executor.h — runs one rank's lowered action list (docs/architecture.md): compute
 * actions go to a zb_backend, SEND/RECV actions to a zb_transport, and each
 * iteration is measured into a zb_rank_iteration (zb.v1.RankIteration's
 * fields). The executor knows only the two vtables, not which backend or
 * transport it drives.
 *
 * Walking the list: actions are issued in list order. A maximal run of
 * comm actions chained by the `batch` flag (zb_schedule.h) is posted as
 * one transport group and completes as a whole; a comm action without the
 * flag is a group of one. FSDP and empty actions take no time; a
 * REDUCE_GRAD runs the config's reduce hook (see the config: overlapped
 * on a device-ordered transport, else host-blocking). How a group
 * holds the rank depends on the transport (docs/schedules.md, Execution
 * model):
 *   device-ordered (nccl, zb_transport_device_ordered, unless
 *   blocking_comm): the group is posted (zb_transport_group_post) and the
 *   host goes on. The group is ordered after the compute work issued
 *   before it (so a send reads its producer's finished output), a compute
 *   op that reads a received message is ordered after that receive's group
 *   (zb_transport_order_device), and nothing else waits for it: no device
 *   drain before a send, no host wait, except the transport's window
 *   (at most that many groups in flight) and, at the end of the iteration,
 *   zb_transport_drain then the backend sync. Buffers: every (kind, stage,
 *   microbatch) slot is written once per iteration (zb_backend.h), so no
 *   buffer is rewritten while a group in flight reads it, and the drain
 *   ends every use before the next iteration reuses them.
 *   host-blocking (tcp, or blocking_comm): before a group that holds a
 *   send the backend is synced (the bytes must be complete), and the group
 *   is waited for (zb_transport_group_end) before the next action.
 * At the end of an iteration the backend is synced and its stats taken.
 *
 * Measurements per iteration:
 *   wall        from just before the first action to just after the last one
 *               and the final backend sync (CLOCK_MONOTONIC);
 *   busy F/B/W  what the backend measured; a fused BW counts as B and W in
 *               the ratio of its stage's T_B : T_W (zb_backend.h);
 *   idle        wall - (busy F + B + W), never below 0;
 *   bytes_sent  payload bytes the transport wrote in the iteration;
 *   peak_memory the plan's accounting: the running sum of the per-stage
 *               M_F/M_B/M_W deltas of the compute actions in order, its
 *               maximum divided by the rank's M_F (the sum of m_f over the
 *               stages in the list), so 1F1B's rank 0 peaks at p;
 *   peak_memory_bytes  the backend's peak when it tracks memory, else
 *               peak_memory x bytes_per_activation.
 *   timeline    on sampled iterations (trace_every): when each compute op
 *               and each transport group (post to completion) ran, in run
 *               order, seconds from the iteration's start. The backend is
 *               synced after each compute op of such an iteration, and a
 *               posted group is drained, so an asynchronous backend's op
 *               and a group end when their work does (such an iteration
 *               overlaps nothing); the two clock reads per op are all a
 *               synchronous backend pays.
 *
 * Ownership: the caller owns the zb_executor (zb_executor_free, NULL is a
 * no-op). The action list and costs are copied; the backend, transport and
 * stop flag are borrowed and must outlive the executor. An executor is used
 * by one thread; the stop flag may be raised from any.
 *
 * Results: zb_err from lib/zb_err.h; errors come from the backend or the
 * transport (see their headers) with a prefix naming the rank, iteration
 * and action ("rank 2, iteration 0, action 17 (2RECV_F3): ..."). A raised
 * stop flag ends a running iteration with ZB_ERR_IO ("stopped ...").
 */
#ifndef ZB_EXECUTOR_H
#define ZB_EXECUTOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zb_backend.h"
#include "zb_schedule.h"
#include "zb_timeline.h"
#include "zb_transport.h"

/* One rank's measurements of one iteration; the first fields mirror
 * zb.v1.RankIteration. */
typedef struct zb_rank_iteration {
  int32_t rank;
  double wall_seconds;
  double busy_f_seconds, busy_b_seconds, busy_w_seconds;
  double idle_seconds;
  int64_t bytes_sent;
  double peak_memory; /* M_F units, as the plan accounts it */
  int64_t peak_memory_bytes;
  double bubble_ratio; /* idle / wall of this rank */
  /* Beyond RankIteration: */
  int32_t iteration;
  double start_seconds, end_seconds; /* CLOCK_MONOTONIC, comparable across ranks of a host */
  double comm_seconds; /* host time in transport groups (device-ordered: posting, the window, the drain) */
  double cpu_wait_seconds;          /* of the busy time: runnable without a core (zb_backend_stats) */
  int32_t comm_groups;              /* transport groups posted (zb_comm_group_count of the list) */
  int32_t comm_actions;             /* sends and receives in them */
  int64_t host_syncs;               /* the backend's waits for its device (zb_backend_stats; -1: none) */
  int64_t device_peak, device_used; /* the GPU's figures (zb_backend_stats; -1: none) */
  /* Sampled iterations only (else NULL, 0): ops in run order, start and
   * end in seconds from start_seconds. Owned by the executor; valid until
   * its next iteration. */
  const zb_tl_op *timeline;
  int n_timeline;
} zb_rank_iteration;

typedef struct zb_executor_config {
  int rank, nranks;
  const zb_action *actions; /* the rank's lowered list; copied */
  int n_actions;
  /* Memory deltas by stage (m_f, m_b, m_w) for the plan's accounting; op
   * times are the backend's business. Copied. Must cover every stage of
   * the list. */
  const zb_costs *costs;
  size_t bytes_per_activation; /* payload of every SEND/RECV */
  const atomic_bool *stop;     /* may be NULL; borrowed */
  int trace_every;             /* timelines of iterations 0, N, 2N, ...; 0: none */
  /* Waits for every group on the host and syncs the backend before each
   * send even on a device-ordered transport, and makes every REDUCE_GRAD
   * host-blocking: the executor before overlap (tests compare the two). */
  bool blocking_comm;
  /* The transport rank of this replica's pipeline rank 0 (replica x p,
   * docs/formats.md, Data parallelism): the list's peer q is transport
   * rank peer_base + q. 0 with one replica. */
  int peer_base;
  /* REDUCE_GRAD(stage) (docs/schedules.md, Gradient reduction), with
   * reduce set; NULL: REDUCE_GRAD takes no time (the sim backend, one
   * replica). The two hooks' contract: reduce(reduce_ud, stage, iteration)
   * starts the stage's reduction after the compute submitted so far (it
   * may finish it too: the ring does), and reduce_wait(reduce_ud,
   * iteration) completes every started one: the gradients' consumers
   * (the 1/d scale, the step, the next iteration's zeroing) ordered after
   * it, the host waiting where the hook needs to bound it. Both run on the
   * host, timed as communication; a failure fails the iteration like a
   * transport's.
   *   overlapped (device-ordered, unless blocking_comm, with reduce_wait
   *   set, on an iteration that is not sampled): REDUCE_GRAD calls reduce
   *   only (no drain, no backend sync: the device orders the reduction
   *   after the stage's last W), so the reduction runs while the ops after
   *   it do, as the device-ordered simulator models it;
   *   WAIT_REDUCE_GRAD calls reduce_wait, and so does the end of a list
   *   without one, before the iteration's drain and sync.
   *   host-blocking (otherwise): REDUCE_GRAD drains the groups in flight
   *   (device-ordered), syncs the backend (the gradients are final), calls
   *   reduce, then reduce_wait when set; WAIT_REDUCE_GRAD is a no-op.
   * reduce_wait may be NULL: reduce then completes each reduction. */
  zb_err (*reduce)(void *reduce_ud, int stage, int iteration, zb_diag *diag);
  zb_err (*reduce_wait)(void *reduce_ud, int iteration, zb_diag *diag);
  /* May be NULL. On a failed iteration, beside the transport's abort:
   * poisons what the reductions run on (a cuda job's stage group), so the
   * other replicas' members blocked on this rank fail now. */
  void (*reduce_abort)(void *reduce_ud, const char *why);
  void *reduce_ud; /* borrowed */
} zb_executor_config;

typedef struct zb_executor zb_executor;

/* Checks cfg's list (stages and microbatches in range, comm peers other
 * ranks, a RECV's sending stage exists) and creates an executor over
 * backend and transport (borrowed; the transport must already be connected
 * to the peers zb_executor_peers names). Caller owns *out. Does not block.
 * ZB_ERR_INVALID_ARG names the first bad action. */
zb_err zb_executor_new(const zb_executor_config *cfg, zb_backend *backend, zb_transport *transport,
                       zb_executor **out, zb_diag *diag);

/* Frees e (not the backend or transport it borrows); NULL is a no-op. */
void zb_executor_free(zb_executor *e);

/* Sets peers[q] (nranks entries) to whether the list exchanges messages
 * with rank q: what to pass to zb_transport_connect. Both ends of a pair
 * agree, since every send has its receive. Does not block. */
void zb_executor_peers(const zb_action *actions, int n_actions, int nranks, bool *peers);

/* Runs the list once and fills *out (iteration is copied into it). Blocks
 * for the iteration: on compute, on peers, until a failure or the stop
 * flag. On any failure it aborts the transport (zb_transport_abort) and
 * calls reduce_abort, so peers waiting on this rank fail promptly instead
 * of hanging; the job cannot continue on that transport. */
zb_err zb_executor_run_iteration(zb_executor *e, int iteration, zb_rank_iteration *out, zb_diag *diag);

/* Called after each iteration of zb_executor_run with its measurements;
 * returns false to stop after it (e.g. to switch to an updated plan). */
typedef bool (*zb_iteration_cb)(void *ud, const zb_rank_iteration *it);

/* Runs iterations first, first+1, ... up to count of them, calling cb (may
 * be NULL) after each. Stops early without error when cb returns false or
 * the stop flag is seen between iterations; *done (may be NULL) tells how
 * many completed. A stop flag raised during an iteration fails it (ZB_ERR_IO).
 * Blocks for the whole run. */
zb_err zb_executor_run(zb_executor *e, int first, int count, zb_iteration_cb cb, void *ud, int *done,
                       zb_diag *diag);

#endif
