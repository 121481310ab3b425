/* zb_schedule.h — the vocabulary of libzb: actions, per-rank action lists,
 * placement and the cost model (docs/schedules.md, Vocabulary; Cost and
 * memory model).
 *
 * Ownership: a zb_schedule owns its per-rank arrays; zb_schedule_free()
 * releases them and accepts NULL. A zb_costs owns its per-stage arrays;
 * zb_costs_free() likewise. Nothing here performs I/O or keeps globals.
 */
#ifndef ZB_SCHEDULE_H
#define ZB_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "zb_err.h"

/* Kinds of action. B is the input gradient (PyTorch's "I"); BW is B and W
 * fused (PyTorch's "B"). The FSDP kinds and PyTorch's waits (a send's
 * completion, the gradient reduction's) are carried through import and
 * export as markers: they take no time and have no dependencies. */
typedef enum zb_op {
  ZB_OP_NONE = 0, /* an empty CSV cell */
  ZB_OP_F,
  ZB_OP_B,
  ZB_OP_W,
  ZB_OP_BW,
  ZB_OP_SEND_F,
  ZB_OP_RECV_F,
  ZB_OP_SEND_B,
  ZB_OP_RECV_B,
  ZB_OP_UNSHARD,
  ZB_OP_RESHARD,
  ZB_OP_REDUCE_GRAD,
  ZB_OP_WAIT_SEND_F, /* PyTorch: waits for SEND_F of (stage, mb) to complete */
  ZB_OP_WAIT_SEND_B,
  ZB_OP_WAIT_REDUCE_GRAD,
  ZB_OP_COUNT_
} zb_op;

/* One entry of a rank's list. For SEND_F/SEND_B `stage` is the sending
 * stage, for RECV_F/RECV_B the receiving stage (PyTorch's convention); peer
 * is the other rank. mb is -1 for actions without a microbatch. batch is
 * true when this comm action is posted in one group with the next one.
 * overlap is true when this compute action and the next one run as one
 * overlapped pair (PyTorch's DualPipeV "(0F3;3B1)OVERLAP_F_B"). */
typedef struct zb_action {
  int64_t peer : 16;    /* a rank (below ZB_MAX_RANKS) or -1 */
  uint64_t op : 4;      /* a zb_op */
  uint64_t batch : 1;   /* (a bool) */
  uint64_t overlap : 1; /* (a bool) */
  int64_t stage : 18;   /* below ZB_MAX_STAGES, or negative */
  int64_t mb : 24;      /* below ZB_MAX_MICROBATCHES, or -1 */
} zb_action;
/* 8 bytes, one word: p = 256, m = 4096 lowers to 15 to 25 million actions,
 * and every pass of planning at scale reads them all. Whatever makes an
 * action from outside numbers (a file, the wire) checks them against the
 * limits below first: a store into a field keeps only its low bits. */
_Static_assert(sizeof(zb_action) == 8, "zb_action is one 8-byte word");
_Static_assert(ZB_OP_COUNT_ <= 15, "every op, and ZB_OP_COUNT_ as an unknown one, fits 4 bits");

/* How far ahead a pass that takes the ranks in turns (the simulation, the
 * validator's deadlock run) asks for a list's actions: three cache lines,
 * as many as a rank gets through in a few turns. */
#define ZB_PREFETCH_ACTIONS 24

/* Ranks a schedule may have: a peer is 16 bits. */
#define ZB_MAX_RANKS 32767
/* Stages (p * v) and microbatches a schedule may have: an action's stage
 * is 18 bits and its microbatch 24 (signed). */
#define ZB_MAX_STAGES 131071
#define ZB_MAX_MICROBATCHES 8388607

typedef enum zb_placement {
  ZB_PLACE_LOOP = 0, /* stage s on rank s mod p */
  ZB_PLACE_V = 1,    /* v = 2: stage s on rank s for s < p, else 2p-1-s */
  ZB_PLACE_INFER = 2 /* only as a request to the CSV reader: from the file */
} zb_placement;

typedef struct zb_rank_list {
  zb_action *actions;
  int n;
  int cap;
  bool in_block; /* actions lie in the schedule's block: moved out to grow */
} zb_rank_list;

typedef struct zb_schedule {
  int p; /* ranks */
  int v; /* chunks (stages) per rank */
  int m; /* microbatches */
  zb_placement placement;
  zb_rank_list *ranks; /* p lists */
  zb_action *block;    /* every list's room in one allocation, or NULL */
} zb_schedule;

/* Allocates an empty schedule of p ranks (all lists empty). Caller owns the
 * result and frees it with zb_schedule_free(). Returns NULL only when the
 * shape is not positive or above ZB_MAX_RANKS, ZB_MAX_STAGES (p * v) or
 * ZB_MAX_MICROBATCHES. */
zb_schedule *zb_schedule_new(int p, int v, int m, zb_placement placement);
/* zb_schedule_new with room for `per_mb` actions a microbatch on every
 * rank (per_mb * m, at most INT_MAX), in one block
 * (zb_schedule_reserve_all): a generator's whole plan. */
zb_schedule *zb_schedule_new_room(int p, int v, int m, zb_placement placement, int per_mb);
void zb_schedule_free(zb_schedule *s);
/* Deep copy; caller owns the result. */
zb_schedule *zb_schedule_clone(const zb_schedule *s);
/* Grows rank r's list so that one more action fits (zb_schedule_push's
 * slow path). */
void zb_schedule_grow(zb_schedule *s, int rank);
/* Appends one action to rank r's list. Inline, like the predicates below:
 * planning at scale runs them tens of millions of times. */
static inline void zb_schedule_push(zb_schedule *s, int rank, zb_action a) {
  zb_rank_list *l = &s->ranks[rank];
  if (l->n == l->cap)
    zb_schedule_grow(s, rank);
  l->actions[l->n++] = a;
}
/* Shorthand for a compute action (peer -1, batch false). */
static inline void zb_schedule_push_op(zb_schedule *s, int rank, zb_op op, int stage, int mb) {
  zb_schedule_push(s, rank, (zb_action){.op = (uint8_t)op, .stage = stage, .mb = mb, .peer = -1});
}
/* Makes room for n actions in rank's list (a generator that knows its
 * count saves the copies of growing). */
void zb_schedule_reserve(zb_schedule *s, int rank, int n);
/* Room for n[r] actions in every rank r's list, all in one block of
 * large memory (zb_alloc.h): what a plan's producer that knows its counts
 * uses for lists of many megabytes. Every list starts empty: whatever the
 * lists held is dropped, a block of an earlier call with it. One that
 * outgrows its room moves to its own allocation. */
void zb_schedule_reserve_all(zb_schedule *s, const int *n);
/* Total number of stages, p*v. */
static inline int zb_schedule_stages(const zb_schedule *s) {
  return s->p * s->v;
}
/* Rank of a stage for an explicit shape (same rule as zb_stage_rank). */
static inline int zb_placement_rank(zb_placement pl, int p, int v, int stage) {
  (void)v;
  if (pl == ZB_PLACE_V)
    return stage < p ? stage : 2 * p - 1 - stage;
  return stage % p;
}
/* Rank that hosts stage `stage` under the schedule's placement. */
static inline int zb_stage_rank(const zb_schedule *s, int stage) {
  return zb_placement_rank(s->placement, s->p, s->v, stage);
}
/* Every rank's peers: the ranks hosting a stage next to one of its own,
 * itself left out, each once, by stage order. Rank r's are
 * peer[r * cap ...], npeer[r] of them (zeroed by the caller); cap =
 * 2 * v is room for all. */
void zb_schedule_peers(const zb_schedule *s, int cap, int *peer, int *npeer);
/* 1 when 0 <= v < n, else 0 (a negative v is out of range as unsigned):
 * an int, so that several such tests join with & into one test without
 * a branch each, for passes that check every action. */
static inline int zb_in(int v, int n) {
  return (unsigned)v < (unsigned)n;
}
/* true for F, B, W, BW. */
static inline bool zb_op_is_compute(zb_op op) {
  return op == ZB_OP_F || op == ZB_OP_B || op == ZB_OP_W || op == ZB_OP_BW;
}
/* true for the four SEND/RECV kinds. */
static inline bool zb_op_is_comm(zb_op op) {
  return op == ZB_OP_SEND_F || op == ZB_OP_RECV_F || op == ZB_OP_SEND_B || op == ZB_OP_RECV_B;
}
/* Name used in output: "F", "B", "W", "BW", "SEND_F", ... */
const char *zb_op_name(zb_op op);
/* Number of compute actions of rank r. */
int zb_schedule_compute_count(const zb_schedule *s, int rank);
/* Removes every comm action, leaving compute and FSDP actions in order
 * (the inverse of lowering). */
void zb_schedule_strip_comm(zb_schedule *s);
/* true when any rank's list holds a comm action. */
bool zb_schedule_has_comm(const zb_schedule *s);
/* The last index of the transport group that starts at comm action i of a
 * list: the maximal run of comm actions chained by `batch` (a comm action
 * without the flag is a group of one). The executor posts each such run as
 * one group; the wire carries the flags unchanged (docs/schedules.md,
 * Lowering). */
int zb_comm_group_end(const zb_action *actions, int n, int i);
/* Number of transport groups in a list (what one iteration posts). */
int zb_comm_group_count(const zb_action *actions, int n);
/* true when the schedule splits backward into B and W (no BW anywhere). */
bool zb_schedule_splits_w(const zb_schedule *s);

/* Cost model (docs/schedules.md, Cost and memory model), per stage: times
 * of F, B, W on that stage, memory deltas (F > 0, B and W <= 0, summing to
 * zero), one hop's communication time, and a per-rank memory limit (<= 0:
 * none). t_reduce is the time to average the stage's gradients across its
 * data-parallel replicas once per iteration (0: one replica, nothing to
 * reduce). All arrays have n_stages entries. */
typedef struct zb_costs {
  int n_stages;
  double *t_f, *t_b, *t_w;
  double *t_reduce;
  double *m_f, *m_b, *m_w;
  double t_comm;
  double mem_limit;
} zb_costs;

/* Per-rank whole-share figures, as a user gives them (docs/schedules.md,
 * Cost and memory model). */
typedef struct zb_rank_costs {
  double t_f, t_b, t_w, t_comm;
  double t_reduce; /* the rank's whole share of the gradient reduction (0: none) */
  double m_f, m_b, m_w;
} zb_rank_costs;

/* Default figures: T_F = T_B = T_W = 1, T_comm = 0, M_F = 1, M_B = -0.5,
 * M_W = -0.5. */
zb_rank_costs zb_rank_costs_default(void);
/* Allocates costs for n_stages stages (zeroed, no limit). */
zb_costs *zb_costs_new(int n_stages);
void zb_costs_free(zb_costs *c);
zb_costs *zb_costs_clone(const zb_costs *c);
/* Costs for p ranks with v chunks each from one rank's whole share: each
 * chunk op gets 1/v of the times and memory deltas; t_comm is per hop.
 * mem_limit is copied unchanged. Caller owns the result. */
zb_costs *zb_costs_from_rank_share(int p, int v, const zb_rank_costs *rc, double mem_limit);
/* Checks signs and the zero-sum of memory deltas; explains in diag. */
zb_err zb_costs_check(const zb_costs *c, zb_diag *diag);
/* One rank's whole-share M_F for a schedule of that shape (the unit in
 * which peaks and limits are reported): sum of m_f over the rank's stages. */
double zb_costs_rank_mf(const zb_costs *c, zb_placement pl, int p, int v, int rank);
/* Time and memory delta of one compute op under c (BW = B + W); 0 for
 * any other kind. */
static inline double zb_costs_time(const zb_costs *c, zb_op op, int stage) {
  switch (op) {
  case ZB_OP_F: return c->t_f[stage];
  case ZB_OP_B: return c->t_b[stage];
  case ZB_OP_W: return c->t_w[stage];
  case ZB_OP_BW: return c->t_b[stage] + c->t_w[stage];
  default: return 0;
  }
}
static inline double zb_costs_mem(const zb_costs *c, zb_op op, int stage) {
  switch (op) {
  case ZB_OP_F: return c->m_f[stage];
  case ZB_OP_B: return c->m_b[stage];
  case ZB_OP_W: return c->m_w[stage];
  case ZB_OP_BW: return c->m_b[stage] + c->m_w[stage];
  default: return 0;
  }
}
/* Where compute op `op` of `stage` lies in a table of zb_costs_op_table
 * for S stages. */
static inline size_t zb_costs_op_at(zb_op op, int stage, int S) {
  return (size_t)(op - ZB_OP_F) * (size_t)S + (size_t)stage;
}
/* zb_costs_time (mem false) or zb_costs_mem (mem true) of every compute
 * op and stage of c, at zb_costs_op_at: a look-up without a switch per
 * op, for passes that ask for every action. The caller frees it. */
double *zb_costs_op_table(const zb_costs *c, bool mem);

#endif
