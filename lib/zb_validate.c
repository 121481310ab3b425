/* zb_validate.c — see zb_validate.h. One pass over every list checks each
 * action (range, placement, duplicates, same-rank order, comm peers) and
 * notes the first violation of each kind; two passes over the (stage,
 * microbatch) cells find what never ran or was never paired; a worklist
 * run finds deadlocks (zb_validate_deadlock.c). The kinds are reported in the order of
 * zb_violation_kind, each at its first occurrence in rank-major order,
 * which is what checking them one after another would report: at
 * p = 256, m = 4096 a lowered V plan has 15 million actions, and each
 * pass over them costs about 100 ms. */
#include "zb_validate_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"

const char *zb_violation_kind_name(zb_violation_kind k) {
  switch (k) {
  case ZB_VIOL_NONE: return "none";
  case ZB_VIOL_BAD_ACTION: return "bad-action";
  case ZB_VIOL_PLACEMENT: return "placement";
  case ZB_VIOL_DUPLICATE: return "duplicate";
  case ZB_VIOL_MISSING: return "missing";
  case ZB_VIOL_DEPENDENCY: return "dependency";
  case ZB_VIOL_COMM_MISMATCH: return "comm-mismatch";
  case ZB_VIOL_DEADLOCK: return "deadlock";
  case ZB_VIOL_MEMORY: return "memory";
  }
  return "?";
}

void zb_violation_format(const zb_violation *v, char *buf, int len) {
  if (v->kind == ZB_VIOL_NONE) { /* valid, or not checked (the reason in detail) */
    snprintf(buf, (size_t)len, "%s", v->detail[0] ? v->detail : "valid");
    return;
  }
  const zb_action *a = &v->action;
  char act[48];
  if (a->mb >= 0)
    snprintf(act, sizeof act, "%s stage %d mb %d", zb_op_name(a->op), a->stage, a->mb);
  else
    snprintf(act, sizeof act, "%s stage %d", zb_op_name(a->op), a->stage);
  snprintf(buf, (size_t)len, "%s at rank %d index %d (%s): %s", zb_violation_kind_name(v->kind), v->rank,
           v->index, act, v->detail);
}

zb_err zb_validate_violation(zb_violation *out, zb_violation_kind k, int rank, int index, const zb_action *a,
                             const char *fmt, ...) {
  out->kind = k;
  out->rank = rank;
  out->index = index;
  out->action = *a;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out->detail, sizeof out->detail, fmt, ap);
  va_end(ap);
  return ZB_ERR_INVALID_SCHEDULE;
}

/* The bits of a cell. Seen: F, B, W and BW of the cell; F and B done so
 * far and their RECVs (each cell is touched only by the rank of its stage
 * once placement holds); the send and recv of each transfer, keyed by the
 * producing stage. */
enum {
  CELL_F = 1 << 0,
  CELL_B = 1 << 1,
  CELL_W = 1 << 2,
  CELL_BW = 1 << 3,
  CELL_FDONE = 1 << 4,
  CELL_BDONE = 1 << 5,
  CELL_FRECV = 1 << 6,
  CELL_BRECV = 1 << 7,
  CELL_SENDF = 1 << 8,
  CELL_RECVF = 1 << 9,
  CELL_SENDB = 1 << 10,
  CELL_RECVB = 1 << 11,
};

static size_t vidx(const vctx *x, int stage, int mb) {
  return (size_t)stage * x->m + mb;
}

/* Whether cell (stage, mb) has bit. */
static bool vhas(const vctx *x, int stage, int mb, uint16_t bit) {
  return x->cell[vidx(x, stage, mb)] & bit;
}

static uint16_t vseen_bit(zb_op op) {
  return op == ZB_OP_F ? CELL_F : op == ZB_OP_B ? CELL_B : op == ZB_OP_W ? CELL_W : CELL_BW;
}

/* Notes a violation of kind k unless one was noted already. */
#define NOTE(x, k, r, i, a, ...)                                                                             \
  do {                                                                                                       \
    if ((x)->first[k].kind == ZB_VIOL_NONE)                                                                  \
      zb_validate_violation(&(x)->first[k], k, r, i, a, __VA_ARGS__);                                        \
  } while (0)

/* The stage a comm action talks to. */
static int comm_other(const zb_action *a) {
  return a->op == ZB_OP_SEND_F   ? a->stage + 1
         : a->op == ZB_OP_SEND_B ? a->stage - 1
         : a->op == ZB_OP_RECV_F ? a->stage - 1
                                 : a->stage + 1;
}

/* Ranges, which later checks index by: the first out-of-range action
 * stops the scan (ZB_ERR_INVALID_SCHEDULE into out). */
static zb_err check_range(const vctx *x, int r, int i, const zb_action *a, zb_violation *out) {
  if (a->op >= ZB_OP_COUNT_)
    return zb_validate_violation(out, ZB_VIOL_BAD_ACTION, r, i, a, "unknown action kind %d", (int)a->op);
  if (a->stage < 0 || a->stage >= x->S)
    return zb_validate_violation(out, ZB_VIOL_BAD_ACTION, r, i, a, "stage %d outside 0..%d", a->stage,
                                 x->S - 1);
  bool comm = zb_op_is_comm(a->op);
  if ((zb_op_is_compute(a->op) || comm) && (a->mb < 0 || a->mb >= x->m))
    return zb_validate_violation(out, ZB_VIOL_BAD_ACTION, r, i, a, "microbatch %d outside 0..%d", a->mb,
                                 x->m - 1);
  if (comm) {
    int nb = comm_other(a);
    if (nb < 0 || nb >= x->S)
      return zb_validate_violation(out, ZB_VIOL_BAD_ACTION, r, i, a,
                                   "no neighbouring stage %d to communicate with", nb);
    if (a->peer < 0 || a->peer >= x->s->p)
      return zb_validate_violation(out, ZB_VIOL_BAD_ACTION, r, i, a, "peer rank %d outside 0..%d", a->peer,
                                   x->s->p - 1);
  }
  return ZB_OK;
}

/* Whether a is a compute or comm op whose stage, microbatch (and, for
 * comm, neighbouring stage and peer) are in range: what nearly every
 * action is, told in one test per kind without a branch per field
 * (zb_in). Any other goes to check_range. */
static inline bool in_range(const vctx *x, const zb_action *a) {
  int cell = zb_in(a->stage, x->S) & zb_in(a->mb, x->m);
  switch (a->op) {
  case ZB_OP_F:
  case ZB_OP_B:
  case ZB_OP_W:
  case ZB_OP_BW: return cell;
  case ZB_OP_SEND_F:
  case ZB_OP_RECV_B: return cell & zb_in(a->stage + 1, x->S) & zb_in(a->peer, x->s->p);
  case ZB_OP_RECV_F:
  case ZB_OP_SEND_B: return cell & zb_in(a->stage - 1, x->S) & zb_in(a->peer, x->s->p);
  default: return false; /* any other: check_range's to tell */
  }
}

/* A compute op seen twice (a BW with its B or W counts too). */
static void check_duplicate(vctx *x, int r, int i, const zb_action *a) {
  uint16_t *cell = &x->cell[vidx(x, a->stage, a->mb)];
  uint16_t clash = a->op == ZB_OP_BW  ? CELL_BW | CELL_B | CELL_W
                   : a->op == ZB_OP_F ? CELL_F
                                      : vseen_bit((zb_op)a->op) | CELL_BW;
  bool dup = *cell & clash;
  *cell |= vseen_bit((zb_op)a->op);
  if (dup)
    NOTE(x, ZB_VIOL_DUPLICATE, r, i, a, "%s of stage %d microbatch %d appears more than once",
         zb_op_name(a->op), a->stage, a->mb);
}

/* Same-rank order of compute action a, and for lowered lists its
 * RECV before it (the scan marks each RECV and checks each SEND after
 * its producer in place, check_actions). */
static void check_order(vctx *x, int r, int i, const zb_action *a) {
  int st = a->stage, mb = a->mb;
  switch (a->op) {
  case ZB_OP_F:
    if (st > 0) {
      bool local = x->stage_rank[st - 1] == r;
      if (local && !vhas(x, st - 1, mb, CELL_FDONE))
        NOTE(x, ZB_VIOL_DEPENDENCY, r, i, a, "runs before F of stage %d on the same rank", st - 1);
      else if (!local && x->lowered && !vhas(x, st, mb, CELL_FRECV))
        NOTE(x, ZB_VIOL_DEPENDENCY, r, i, a, "no RECV_F of its input before it");
    }
    x->cell[vidx(x, st, mb)] |= CELL_FDONE;
    break;
  case ZB_OP_B:
  case ZB_OP_BW:
    if (!vhas(x, st, mb, CELL_FDONE))
      NOTE(x, ZB_VIOL_DEPENDENCY, r, i, a, "runs before its own F");
    else if (st < x->S - 1) {
      bool local = x->stage_rank[st + 1] == r;
      if (local && !vhas(x, st + 1, mb, CELL_BDONE))
        NOTE(x, ZB_VIOL_DEPENDENCY, r, i, a, "runs before B of stage %d on the same rank", st + 1);
      else if (!local && x->lowered && !vhas(x, st, mb, CELL_BRECV))
        NOTE(x, ZB_VIOL_DEPENDENCY, r, i, a, "no RECV_B of its input before it");
    }
    x->cell[vidx(x, st, mb)] |= CELL_BDONE;
    break;
  case ZB_OP_W:
    if (!vhas(x, st, mb, CELL_BDONE))
      NOTE(x, ZB_VIOL_DEPENDENCY, r, i, a, "runs before its B");
    break;
  default: break;
  }
}

/* check_order of a SEND: its producer (done_bit) ran before it. */
static void check_sent(vctx *x, int r, int i, const zb_action *a, uint16_t done_bit, const char *what) {
  if (!vhas(x, a->stage, a->mb, done_bit))
    NOTE(x, ZB_VIOL_DEPENDENCY, r, i, a, "%s", what);
}

/* A comm action's peer, and each transfer's send and recv at most once.
 * step: how far its other stage lies (comm_other); send: whether it is a
 * send, whose transfer is keyed by its own stage, not the other; bit:
 * its side's CELL_* bit. Constants where the scan calls it, one copy per
 * kind: no test of the op in it. */
static inline __attribute__((always_inline)) void check_comm(vctx *x, int r, int i, const zb_action *a,
                                                             int step, bool send, uint16_t bit) {
  int other = a->stage + step;
  int prod = send ? a->stage : other;
  int peer = x->stage_rank[other];
  if (peer == r)
    NOTE(x, ZB_VIOL_COMM_MISMATCH, r, i, a, "stage %d is on this rank: the tensor stays local", other);
  else if (a->peer != peer)
    NOTE(x, ZB_VIOL_COMM_MISMATCH, r, i, a, "peer is rank %d but stage %d lives on rank %d", a->peer, other,
         peer);
  uint16_t *cell = &x->cell[vidx(x, prod, a->mb)];
  if (*cell & bit)
    NOTE(x, ZB_VIOL_COMM_MISMATCH, r, i, a, "the same tensor is communicated twice");
  *cell |= bit;
}

/* The one pass over every action; fails only on a range violation. */
static zb_err check_actions(vctx *x, zb_violation *out) {
  const zb_schedule *s = x->s;
  double lim = x->c && x->c->mem_limit > 0 ? x->c->mem_limit : 0;
  for (int r = 0; r < s->p; r++) {
    double mem = 0;
    zb_validate_reduce_rank_begin(x);
    for (int i = 0; i < s->ranks[r].n; i++) {
      /* a copy: nothing the checks store can alias it, so its fields are
       * taken out of their word once */
      const zb_action copy = s->ranks[r].actions[i], *a = &copy;
      if (a->op == ZB_OP_NONE)
        continue;
      zb_err err = in_range(x, a) ? ZB_OK : check_range(x, r, i, a, out);
      if (err)
        return err;
      if (x->stage_rank[a->stage] != r)
        NOTE(x, ZB_VIOL_PLACEMENT, r, i, a, "stage %d lives on rank %d", a->stage, x->stage_rank[a->stage]);
      bool lowered = x->lowered;
      /* each comm kind its own copy of check_comm, and its part of
       * check_order in place */
      switch (a->op) {
      case ZB_OP_SEND_F:
        lowered ? check_comm(x, r, i, a, 1, true, CELL_SENDF) : (void)0;
        check_sent(x, r, i, a, CELL_FDONE, "sends before its F ran");
        break;
      case ZB_OP_RECV_F:
        lowered ? check_comm(x, r, i, a, -1, false, CELL_RECVF) : (void)0;
        x->cell[vidx(x, a->stage, a->mb)] |= CELL_FRECV;
        break;
      case ZB_OP_SEND_B:
        lowered ? check_comm(x, r, i, a, -1, true, CELL_SENDB) : (void)0;
        check_sent(x, r, i, a, CELL_BDONE, "sends before its B ran");
        break;
      case ZB_OP_RECV_B:
        lowered ? check_comm(x, r, i, a, 1, false, CELL_RECVB) : (void)0;
        x->cell[vidx(x, a->stage, a->mb)] |= CELL_BRECV;
        break;
      case ZB_OP_F:
      case ZB_OP_B:
      case ZB_OP_W:
      case ZB_OP_BW:
        check_duplicate(x, r, i, a);
        mem += lim > 0 ? zb_costs_mem(x->c, a->op, a->stage) : 0;
        if (lim > 0 && mem > lim + 1e-9 * (1 + fabs(lim)))
          NOTE(x, ZB_VIOL_MEMORY, r, i, a, "memory %g exceeds the limit %g", mem, lim);
        check_order(x, r, i, a);
        if (a->op == ZB_OP_W || a->op == ZB_OP_BW)
          zb_validate_reduce_weight(x, r, i, a);
        break;
      case ZB_OP_REDUCE_GRAD:
      case ZB_OP_WAIT_REDUCE_GRAD: zb_validate_reduce_action(x, r, i, a); break;
      default: break;
      }
    }
    zb_validate_reduce_rank_end(x, r);
  }
  return ZB_OK;
}

/* Every F, B and W (or BW) of every cell ran. */
static zb_err check_missing(const vctx *x, zb_violation *out) {
  for (int st = 0; st < x->S; st++)
    for (int mb = 0; mb < x->m; mb++) {
      uint16_t c = x->cell[vidx(x, st, mb)];
      zb_op miss = ZB_OP_NONE;
      if (!(c & CELL_F))
        miss = ZB_OP_F;
      else if (!(c & (CELL_B | CELL_BW)))
        miss = c & CELL_W ? ZB_OP_B : ZB_OP_BW;
      else if (!(c & (CELL_W | CELL_BW)))
        miss = ZB_OP_W;
      if (miss != ZB_OP_NONE) {
        zb_action a = {.op = miss, .stage = st, .mb = mb, .peer = -1};
        return zb_validate_violation(out, ZB_VIOL_MISSING, x->stage_rank[st], -1, &a,
                                     "%s of stage %d microbatch %d never runs", zb_op_name(miss), st, mb);
      }
    }
  return ZB_OK;
}

/* Every cross-rank edge of a lowered schedule carried by a send and a
 * recv. */
static zb_err check_unpaired(const vctx *x, zb_violation *out) {
  const int *sr = x->stage_rank;
  for (int st = 0; st < x->S; st++)
    for (int mb = 0; mb < x->m; mb++) {
      uint16_t c = x->cell[vidx(x, st, mb)];
      bool sendf = c & CELL_SENDF, sendb = c & CELL_SENDB;
      if (st + 1 < x->S && sr[st] != sr[st + 1] && !(sendf && (c & CELL_RECVF))) {
        zb_action a = {.op = sendf ? ZB_OP_RECV_F : ZB_OP_SEND_F, .stage = sendf ? st + 1 : st, .mb = mb};
        a.peer = sr[sendf ? st : st + 1];
        return zb_validate_violation(out, ZB_VIOL_COMM_MISMATCH, sr[a.stage], -1, &a,
                                     "activation of stage %d microbatch %d is %s", st, mb,
                                     sendf ? "sent but never received" : "never sent");
      }
      if (st > 0 && sr[st] != sr[st - 1] && !(sendb && (c & CELL_RECVB))) {
        zb_action a = {.op = sendb ? ZB_OP_RECV_B : ZB_OP_SEND_B, .stage = sendb ? st - 1 : st, .mb = mb};
        a.peer = sr[sendb ? st : st - 1];
        return zb_validate_violation(out, ZB_VIOL_COMM_MISMATCH, sr[a.stage], -1, &a,
                                     "gradient of stage %d microbatch %d is %s", st, mb,
                                     sendb ? "sent but never received" : "never sent");
      }
    }
  return ZB_OK;
}

/* The first noted violation of kind k into out. */
static zb_err report(const vctx *x, zb_violation_kind k, zb_violation *out) {
  if (x->first[k].kind == ZB_VIOL_NONE)
    return ZB_OK;
  *out = x->first[k];
  return ZB_ERR_INVALID_SCHEDULE;
}

/* Every check but the deadlock run, in zb_violation_kind's order. */
static zb_err validate_scan(vctx *x, zb_violation *out) {
  zb_err err = check_actions(x, out);
  if (!err && !(err = report(x, ZB_VIOL_PLACEMENT, out)) && !(err = report(x, ZB_VIOL_DUPLICATE, out)) &&
      !(err = check_missing(x, out)) && !(err = zb_validate_reduce_missing(x, out)) &&
      !(err = report(x, ZB_VIOL_DEPENDENCY, out)) && !(err = report(x, ZB_VIOL_COMM_MISMATCH, out)))
    err = x->lowered ? check_unpaired(x, out) : ZB_OK;
  return err;
}

/* The scan and the deadlock run at once (zb_validate_par): each its own
 * scratch and its own violation. */
typedef struct validate_job {
  vctx *x;
  unsigned char *done;
  zb_violation scan_v, run_v;
  zb_err scan_err, run_err;
  bool gave_up;
} validate_job;

static void validate_piece(void *arg, int k) {
  validate_job *j = arg;
  if (k == 0)
    j->scan_err = validate_scan(j->x, &j->scan_v);
  else
    j->run_err = zb_validate_deadlock(j->x, j->done, true, &j->gave_up, &j->run_v);
}

/* The scan, then (when it passes) the deadlock run and the memory
 * check; with par, the run beside the scan. */
static zb_err validate_run(vctx *x, const zb_par *par, zb_violation *out) {
  size_t cells = (size_t)x->S * x->m;
  /* the run's cells: compute-only lists' (lowered ones pair on channels) */
  validate_job j = {.x = x, .done = x->lowered ? NULL : zb_calloc_large(2 * cells + 1, 1)};
  bool ran = false; /* the run beside the scan went through: its verdict stands */
  if (zb_par_width(par) > 1) {
    zb_par_run(par, validate_piece, &j, 2);
    ran = !j.gave_up;
  } else
    j.scan_err = validate_scan(x, &j.scan_v);
  zb_err err = j.scan_err ? j.scan_err : ran ? j.run_err : ZB_OK;
  if (err)
    *out = j.scan_err ? j.scan_v : j.run_v;
  else if (!ran) {
    if (j.gave_up && j.done) /* cannot be once the scan passed, which finds everything out of range */
      memset(j.done, 0, 2 * cells);
    err = zb_validate_deadlock(x, j.done, false, &j.gave_up, out);
  }
  if (!err)
    err = report(x, ZB_VIOL_MEMORY, out);
  free(j.done);
  return err;
}

zb_err zb_validate(const zb_schedule *s, const zb_costs *c, zb_violation *out) {
  return zb_validate_par(s, c, NULL, out);
}

zb_err zb_validate_par(const zb_schedule *s, const zb_costs *c, const zb_par *par, zb_violation *out) {
  memset(out, 0, sizeof *out);
  out->rank = out->index = -1;
  if (c && c->n_stages != zb_schedule_stages(s)) {
    snprintf(out->detail, sizeof out->detail,
             "the costs describe %d stages but the schedule has %d (p=%d, v=%d)", c->n_stages,
             zb_schedule_stages(s), s->p, s->v);
    return ZB_ERR_INVALID_ARG;
  }
  vctx x = {.s = s, .c = c, .S = zb_schedule_stages(s), .m = s->m, .lowered = zb_schedule_has_comm(s)};
  size_t cells = (size_t)x.S * x.m;
  x.cell = zb_calloc_large(cells + 1, sizeof *x.cell);
  x.stage_rank = zb_malloc(sizeof(int) * (size_t)(x.S > 0 ? x.S : 1));
  x.reduce_at = zb_malloc(sizeof(int) * (size_t)(x.S > 0 ? x.S : 1));
  for (int st = 0; st < x.S; st++) {
    x.stage_rank[st] = zb_stage_rank(s, st);
    x.reduce_at[st] = -1;
  }
  zb_err err = validate_run(&x, par, out);
  free(x.cell);
  free(x.stage_rank);
  free(x.reduce_at);
  return err;
}
