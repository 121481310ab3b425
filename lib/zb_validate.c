#include "zb_validate.h"

#include <math.h>
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

static zb_err viol(zb_violation *out, zb_violation_kind k, int rank, int index, const zb_action *a,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#include <stdarg.h>
static zb_err viol(zb_violation *out, zb_violation_kind k, int rank, int index, const zb_action *a,
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

typedef struct vctx {
  const zb_schedule *s;
  int S, m;
  /* per (stage, mb) counts of F, B, W, BW and, for lowered lists, of
   * sends/recvs per transfer (F output of a stage, B output of a stage) */
  unsigned char *cnt[4]; /* a count stops at 2: that is already a duplicate */
  unsigned char *sendf, *recvf, *sendb, *recvb;
} vctx;

static size_t vidx(const vctx *x, int stage, int mb) {
  return (size_t)stage * x->m + mb;
}

static int vkind(zb_op op) {
  return op == ZB_OP_F ? 0 : op == ZB_OP_B ? 1 : op == ZB_OP_W ? 2 : 3;
}

/* Range and placement of every action. */
static zb_err check_ranges(const vctx *x, zb_violation *out) {
  const zb_schedule *s = x->s;
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (a->op == ZB_OP_NONE)
        continue;
      if (a->op >= ZB_OP_COUNT_)
        return viol(out, ZB_VIOL_BAD_ACTION, r, i, a, "unknown action kind %d", (int)a->op);
      if (a->stage < 0 || a->stage >= x->S)
        return viol(out, ZB_VIOL_BAD_ACTION, r, i, a, "stage %d outside 0..%d", a->stage, x->S - 1);
      bool needs_mb = zb_op_is_compute(a->op) || zb_op_is_comm(a->op);
      if (needs_mb && (a->mb < 0 || a->mb >= x->m))
        return viol(out, ZB_VIOL_BAD_ACTION, r, i, a, "microbatch %d outside 0..%d", a->mb, x->m - 1);
      if (zb_op_is_comm(a->op)) {
        int nb = a->op == ZB_OP_SEND_F   ? a->stage + 1
                 : a->op == ZB_OP_SEND_B ? a->stage - 1
                 : a->op == ZB_OP_RECV_F ? a->stage - 1
                                         : a->stage + 1;
        if (nb < 0 || nb >= x->S)
          return viol(out, ZB_VIOL_BAD_ACTION, r, i, a, "no neighbouring stage %d to communicate with", nb);
        if (a->peer < 0 || a->peer >= s->p)
          return viol(out, ZB_VIOL_BAD_ACTION, r, i, a, "peer rank %d outside 0..%d", a->peer, s->p - 1);
      }
    }
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (a->op == ZB_OP_NONE)
        continue;
      int home = zb_stage_rank(s, a->stage);
      if (home != r)
        return viol(out, ZB_VIOL_PLACEMENT, r, i, a, "stage %d lives on rank %d", a->stage, home);
    }
  return ZB_OK;
}

static zb_err check_counts(vctx *x, zb_violation *out) {
  const zb_schedule *s = x->s;
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (!zb_op_is_compute(a->op))
        continue;
      size_t k = vidx(x, a->stage, a->mb);
      int kind = vkind(a->op);
      x->cnt[kind][k]++;
      bool dup = x->cnt[kind][k] > 1;
      if (a->op == ZB_OP_BW)
        dup = dup || x->cnt[1][k] || x->cnt[2][k];
      else if (a->op == ZB_OP_B || a->op == ZB_OP_W)
        dup = dup || x->cnt[3][k];
      if (dup)
        return viol(out, ZB_VIOL_DUPLICATE, r, i, a, "%s of stage %d microbatch %d appears more than once",
                    zb_op_name(a->op), a->stage, a->mb);
    }
  for (int st = 0; st < x->S; st++)
    for (int mb = 0; mb < x->m; mb++) {
      size_t k = vidx(x, st, mb);
      zb_op miss = ZB_OP_NONE;
      if (!x->cnt[0][k])
        miss = ZB_OP_F;
      else if (!x->cnt[1][k] && !x->cnt[3][k])
        miss = x->cnt[2][k] ? ZB_OP_B : ZB_OP_BW;
      else if (!x->cnt[2][k] && !x->cnt[3][k])
        miss = ZB_OP_W;
      if (miss != ZB_OP_NONE) {
        zb_action a = {.op = miss, .stage = st, .mb = mb, .peer = -1};
        return viol(out, ZB_VIOL_MISSING, zb_stage_rank(s, st), -1, &a,
                    "%s of stage %d microbatch %d never runs", zb_op_name(miss), st, mb);
      }
    }
  return ZB_OK;
}

/* Same-rank order, and for lowered lists RECV-before-use / SEND-after-produce. */
static zb_err check_dependencies(vctx *x, bool lowered, zb_violation *out) {
  const zb_schedule *s = x->s;
  size_t cells = (size_t)x->S * x->m;
  unsigned char *fdone = zb_calloc(cells, 1), *bdone = zb_calloc(cells, 1);
  unsigned char *frecv = zb_calloc(cells, 1), *brecv = zb_calloc(cells, 1);
  zb_err err = ZB_OK;
  /* No reset between ranks: check_ranges saw every stage on its own rank,
   * so each cell is only ever touched by the rank that hosts its stage. */
  for (int r = 0; r < s->p && !err; r++) {
    for (int i = 0; i < s->ranks[r].n && !err; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      int st = a->stage, mb = a->mb;
      switch (a->op) {
      case ZB_OP_F:
        if (st > 0) {
          bool local = zb_stage_rank(s, st - 1) == r;
          if (local && !fdone[vidx(x, st - 1, mb)])
            err =
                viol(out, ZB_VIOL_DEPENDENCY, r, i, a, "runs before F of stage %d on the same rank", st - 1);
          else if (!local && lowered && !frecv[vidx(x, st, mb)])
            err = viol(out, ZB_VIOL_DEPENDENCY, r, i, a, "no RECV_F of its input before it");
        }
        fdone[vidx(x, st, mb)] = 1;
        break;
      case ZB_OP_B:
      case ZB_OP_BW:
        if (!fdone[vidx(x, st, mb)])
          err = viol(out, ZB_VIOL_DEPENDENCY, r, i, a, "runs before its own F");
        else if (st < x->S - 1) {
          bool local = zb_stage_rank(s, st + 1) == r;
          if (local && !bdone[vidx(x, st + 1, mb)])
            err =
                viol(out, ZB_VIOL_DEPENDENCY, r, i, a, "runs before B of stage %d on the same rank", st + 1);
          else if (!local && lowered && !brecv[vidx(x, st, mb)])
            err = viol(out, ZB_VIOL_DEPENDENCY, r, i, a, "no RECV_B of its input before it");
        }
        bdone[vidx(x, st, mb)] = 1;
        break;
      case ZB_OP_W:
        if (!bdone[vidx(x, st, mb)])
          err = viol(out, ZB_VIOL_DEPENDENCY, r, i, a, "runs before its B");
        break;
      case ZB_OP_SEND_F:
        if (!fdone[vidx(x, st, mb)])
          err = viol(out, ZB_VIOL_DEPENDENCY, r, i, a, "sends before its F ran");
        break;
      case ZB_OP_SEND_B:
        if (!bdone[vidx(x, st, mb)])
          err = viol(out, ZB_VIOL_DEPENDENCY, r, i, a, "sends before its B ran");
        break;
      case ZB_OP_RECV_F: frecv[vidx(x, st, mb)] = 1; break;
      case ZB_OP_RECV_B: brecv[vidx(x, st, mb)] = 1; break;
      default: break;
      }
    }
  }
  free(fdone);
  free(bdone);
  free(frecv);
  free(brecv);
  return err;
}

/* Every SEND has exactly one RECV on the right peer and vice versa, and
 * every cross-rank edge is carried by a pair. Transfers are keyed by the
 * producing stage. */
static zb_err check_comm_pairs(vctx *x, zb_violation *out) {
  const zb_schedule *s = x->s;
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (!zb_op_is_comm(a->op))
        continue;
      int other = a->op == ZB_OP_SEND_F   ? a->stage + 1
                  : a->op == ZB_OP_SEND_B ? a->stage - 1
                  : a->op == ZB_OP_RECV_F ? a->stage - 1
                                          : a->stage + 1;
      int prod = (a->op == ZB_OP_SEND_F || a->op == ZB_OP_SEND_B) ? a->stage : other;
      int peer = zb_stage_rank(s, other);
      if (peer == r)
        return viol(out, ZB_VIOL_COMM_MISMATCH, r, i, a, "stage %d is on this rank: the tensor stays local",
                    other);
      if (a->peer != peer)
        return viol(out, ZB_VIOL_COMM_MISMATCH, r, i, a, "peer is rank %d but stage %d lives on rank %d",
                    a->peer, other, peer);
      unsigned char *cnt = a->op == ZB_OP_SEND_F   ? x->sendf
                           : a->op == ZB_OP_RECV_F ? x->recvf
                           : a->op == ZB_OP_SEND_B ? x->sendb
                                                   : x->recvb;
      if (++cnt[vidx(x, prod, a->mb)] > 1)
        return viol(out, ZB_VIOL_COMM_MISMATCH, r, i, a, "the same tensor is communicated twice");
    }
  for (int st = 0; st < x->S; st++)
    for (int mb = 0; mb < x->m; mb++) {
      size_t k = vidx(x, st, mb);
      if (st + 1 < x->S && zb_stage_rank(s, st) != zb_stage_rank(s, st + 1) &&
          (!x->sendf[k] || !x->recvf[k])) {
        zb_action a = {
            .op = x->sendf[k] ? ZB_OP_RECV_F : ZB_OP_SEND_F, .stage = x->sendf[k] ? st + 1 : st, .mb = mb};
        int rank = zb_stage_rank(s, a.stage);
        a.peer = zb_stage_rank(s, x->sendf[k] ? st : st + 1);
        return viol(out, ZB_VIOL_COMM_MISMATCH, rank, -1, &a, "activation of stage %d microbatch %d is %s",
                    st, mb, x->sendf[k] ? "sent but never received" : "never sent");
      }
      if (st > 0 && zb_stage_rank(s, st) != zb_stage_rank(s, st - 1) && (!x->sendb[k] || !x->recvb[k])) {
        zb_action a = {
            .op = x->sendb[k] ? ZB_OP_RECV_B : ZB_OP_SEND_B, .stage = x->sendb[k] ? st - 1 : st, .mb = mb};
        int rank = zb_stage_rank(s, a.stage);
        a.peer = zb_stage_rank(s, x->sendb[k] ? st : st - 1);
        return viol(out, ZB_VIOL_COMM_MISMATCH, rank, -1, &a, "gradient of stage %d microbatch %d is %s", st,
                    mb, x->sendb[k] ? "sent but never received" : "never sent");
      }
    }
  return ZB_OK;
}

/* Runs the lists. Compute-only: an op waits for its inputs (infinite
 * buffering). Lowered: compute runs when reached (its inputs were checked
 * to be received earlier); a group of consecutive comm actions is posted at
 * once and completes when every member's partner has been posted. */
static zb_err check_deadlock(vctx *x, bool lowered, zb_violation *out) {
  const zb_schedule *s = x->s;
  size_t cells = (size_t)x->S * x->m;
  unsigned char *fdone = zb_calloc(cells, 1), *bdone = zb_calloc(cells, 1);
  /* posted flags per transfer: bit 0 send side, bit 1 recv side */
  unsigned char *fpost = zb_calloc(cells, 1), *bpost = zb_calloc(cells, 1);
  int *pos = zb_calloc((size_t)s->p, sizeof(int));
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < s->p; r++) {
      const zb_rank_list *l = &s->ranks[r];
      while (pos[r] < l->n) {
        const zb_action *a = &l->actions[pos[r]];
        if (zb_op_is_comm(a->op) && lowered) {
          int end = pos[r];
          while (end < l->n - 1 && l->actions[end].batch && zb_op_is_comm(l->actions[end + 1].op))
            end++;
          bool all = true;
          for (int k = pos[r]; k <= end; k++) {
            const zb_action *c = &l->actions[k];
            bool send = c->op == ZB_OP_SEND_F || c->op == ZB_OP_SEND_B;
            bool fwd = c->op == ZB_OP_SEND_F || c->op == ZB_OP_RECV_F;
            int prod = send ? c->stage : fwd ? c->stage - 1 : c->stage + 1;
            unsigned char *post = fwd ? fpost : bpost;
            post[vidx(x, prod, c->mb)] |= send ? 1 : 2;
            if (post[vidx(x, prod, c->mb)] != 3)
              all = false;
          }
          if (!all)
            break;
          pos[r] = end + 1;
          progress = true;
          continue;
        }
        if (!lowered && zb_op_is_compute(a->op)) {
          bool ready = true;
          if (a->op == ZB_OP_F && a->stage > 0)
            ready = fdone[vidx(x, a->stage - 1, a->mb)];
          else if ((a->op == ZB_OP_B || a->op == ZB_OP_BW) && a->stage < x->S - 1)
            ready = bdone[vidx(x, a->stage + 1, a->mb)];
          if (!ready)
            break;
        }
        if (a->op == ZB_OP_F)
          fdone[vidx(x, a->stage, a->mb)] = 1;
        else if (a->op == ZB_OP_B || a->op == ZB_OP_BW)
          bdone[vidx(x, a->stage, a->mb)] = 1;
        pos[r]++;
        progress = true;
      }
    }
  }
  zb_err err = ZB_OK;
  for (int r = 0; r < s->p && !err; r++)
    if (pos[r] < s->ranks[r].n)
      err = viol(out, ZB_VIOL_DEADLOCK, r, pos[r], &s->ranks[r].actions[pos[r]],
                 lowered ? "blocked: its communication partner never posts the matching operation"
                         : "blocked: its input is produced only after this rank's later work");
  free(fdone);
  free(bdone);
  free(fpost);
  free(bpost);
  free(pos);
  return err;
}

static zb_err check_memory(const vctx *x, const zb_costs *c, zb_violation *out) {
  const zb_schedule *s = x->s;
  double lim = c->mem_limit;
  for (int r = 0; r < s->p; r++) {
    double mem = 0;
    for (int i = 0; i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (!zb_op_is_compute(a->op))
        continue;
      mem += zb_costs_mem(c, a->op, a->stage);
      if (mem > lim + 1e-9 * (1 + fabs(lim)))
        return viol(out, ZB_VIOL_MEMORY, r, i, a, "memory %g exceeds the limit %g", mem, lim);
    }
  }
  return ZB_OK;
}

zb_err zb_validate(const zb_schedule *s, const zb_costs *c, zb_violation *out) {
  memset(out, 0, sizeof *out);
  out->rank = out->index = -1;
  if (c && c->n_stages != zb_schedule_stages(s)) {
    snprintf(out->detail, sizeof out->detail,
             "the costs describe %d stages but the schedule has %d (p=%d, v=%d)", c->n_stages,
             zb_schedule_stages(s), s->p, s->v);
    return ZB_ERR_INVALID_ARG;
  }
  vctx x = {.s = s, .S = zb_schedule_stages(s), .m = s->m};
  size_t cells = (size_t)x.S * x.m;
  for (int k = 0; k < 4; k++)
    x.cnt[k] = zb_calloc(cells, 1);
  x.sendf = zb_calloc(cells, 1);
  x.recvf = zb_calloc(cells, 1);
  x.sendb = zb_calloc(cells, 1);
  x.recvb = zb_calloc(cells, 1);
  bool lowered = zb_schedule_has_comm(s);
  zb_err err = check_ranges(&x, out);
  if (!err)
    err = check_counts(&x, out);
  if (!err)
    err = check_dependencies(&x, lowered, out);
  if (!err && lowered)
    err = check_comm_pairs(&x, out);
  if (!err)
    err = check_deadlock(&x, lowered, out);
  if (!err && c && c->mem_limit > 0)
    err = check_memory(&x, c, out);
  for (int k = 0; k < 4; k++)
    free(x.cnt[k]);
  free(x.sendf);
  free(x.recvf);
  free(x.sendb);
  free(x.recvb);
  return err;
}
