/* zb_validate.c — see zb_validate.h. One pass over every list checks each
 * action (range, placement, duplicates, same-rank order, comm peers) and
 * notes the first violation of each kind; two passes over the (stage,
 * microbatch) cells find what never ran or was never paired; a worklist
 * run finds deadlocks. The kinds are reported in the order of
 * zb_violation_kind, each at its first occurrence in rank-major order,
 * which is what checking them one after another would report: at
 * p = 256, m = 4096 a lowered V plan has 15 million actions, and each
 * pass over them costs about 100 ms. */
#include "zb_validate.h"

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

static zb_err viol(zb_violation *out, zb_violation_kind k, int rank, int index, const zb_action *a,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));

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

enum { VKINDS = ZB_VIOL_MEMORY + 1 };

typedef struct vctx {
  const zb_schedule *s;
  const zb_costs *c;
  int S, m;
  bool lowered;
  int *stage_rank;
  /* per (stage, mb): what the scan has seen, as CELL_* bits in one
   * word, so that a rank's pass walks one row per stage, not twelve */
  uint16_t *cell;
  zb_violation first[VKINDS]; /* the first of each kind, in scan order */
} vctx;

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
      viol(&(x)->first[k], k, r, i, a, __VA_ARGS__);                                                         \
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
    return viol(out, ZB_VIOL_BAD_ACTION, r, i, a, "unknown action kind %d", (int)a->op);
  if (a->stage < 0 || a->stage >= x->S)
    return viol(out, ZB_VIOL_BAD_ACTION, r, i, a, "stage %d outside 0..%d", a->stage, x->S - 1);
  bool comm = zb_op_is_comm(a->op);
  if ((zb_op_is_compute(a->op) || comm) && (a->mb < 0 || a->mb >= x->m))
    return viol(out, ZB_VIOL_BAD_ACTION, r, i, a, "microbatch %d outside 0..%d", a->mb, x->m - 1);
  if (comm) {
    int nb = comm_other(a);
    if (nb < 0 || nb >= x->S)
      return viol(out, ZB_VIOL_BAD_ACTION, r, i, a, "no neighbouring stage %d to communicate with", nb);
    if (a->peer < 0 || a->peer >= x->s->p)
      return viol(out, ZB_VIOL_BAD_ACTION, r, i, a, "peer rank %d outside 0..%d", a->peer, x->s->p - 1);
  }
  return ZB_OK;
}

/* Whether a is a compute or comm op whose stage, microbatch (and, for
 * comm, neighbouring stage and peer) are in range: what nearly every
 * action is, told in one test without a branch per field (zb_in). Any
 * other goes to check_range. */
static bool in_range(const vctx *x, const zb_action *a) {
  bool comm = zb_op_is_comm(a->op);
  return (int)(comm || zb_op_is_compute(a->op)) & zb_in(a->stage, x->S) & zb_in(a->mb, x->m) &
         (int)(!comm || (zb_in(comm_other(a), x->S) & zb_in(a->peer, x->s->p)));
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
        break;
      default: break;
      }
    }
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
        return viol(out, ZB_VIOL_MISSING, x->stage_rank[st], -1, &a,
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
        return viol(out, ZB_VIOL_COMM_MISMATCH, sr[a.stage], -1, &a,
                    "activation of stage %d microbatch %d is %s", st, mb,
                    sendf ? "sent but never received" : "never sent");
      }
      if (st > 0 && sr[st] != sr[st - 1] && !(sendb && (c & CELL_RECVB))) {
        zb_action a = {.op = sendb ? ZB_OP_RECV_B : ZB_OP_SEND_B, .stage = sendb ? st - 1 : st, .mb = mb};
        a.peer = sr[sendb ? st : st - 1];
        return viol(out, ZB_VIOL_COMM_MISMATCH, sr[a.stage], -1, &a,
                    "gradient of stage %d microbatch %d is %s", st, mb,
                    sendb ? "sent but never received" : "never sent");
      }
    }
  return ZB_OK;
}

/* The deadlock run: each rank advances until it waits, and is advanced
 * again when a rank it waits on moves. Compute-only lists: an op waits
 * for its input's producer (infinite buffering); done_f/done_b hold the
 * completed F and B per cell. Lowered: compute runs when reached (its
 * inputs were checked to be received earlier); a group of consecutive
 * comm actions is posted at once and completes when every member has met
 * its partner. Messages from one rank to another pair up in posting
 * order, as the transports pair them (docs/model.md, Transports): the
 * k-th send meets the k-th receive, and a pair that is not one transfer
 * is a comm-mismatch, even where every transfer has both its sides. */
typedef struct dl_chan {
  uint64_t *tag; /* the queued side's transfers (dl_side), oldest at head */
  int head, n, cap;
  bool sends; /* the queued side: the sender's (true) or the receiver's */
} dl_chan;

typedef struct dl_run {
  const vctx *x;
  unsigned char *done_f, *done_b; /* compute-only */
  int *pos, *work, n_work;
  int *missing; /* lowered: per rank, members of its posted group not yet met */
  int *posted;  /* lowered: per rank, 1 + the last index of its group at pos while it waits, else 0 */
  bool *queued;
  /* lowered: rank r's peers peer[r * cap + j], npeer[r] of them; the
   * channel r -> peer j is chan[r * cap + j], and peer j -> r is
   * chan[in[r * cap + j]] */
  int cap, *peer, *npeer, *in;
  dl_chan *chan;
  bool guarded;  /* before the scan vouched for the lists: check each index (dl_fits, dl_side_fits) */
  bool gave_up;  /* guarded, and an action would index out of range */
  bool mismatch; /* two members met that are not one transfer: in *viol */
  zb_violation *viol;
} dl_run;

/* A cell of done_f/done_b: microbatch-major, unlike vidx, as the ranks
 * take turns here and neighbouring stages reach a microbatch at about the
 * same time (the scan above goes rank by rank, along a stage's row). */
static size_t dl_idx(const vctx *x, int stage, int mb) {
  return (size_t)mb * (size_t)x->S + (size_t)stage;
}

static void dl_wake(dl_run *d, int r) {
  if (!d->queued[r]) {
    d->queued[r] = true;
    d->work[d->n_work++] = r;
  }
}

/* Whether a guarded run may index by compute action c (its cells); an
 * unguarded run may always (the scan passed). An action it may not ends
 * the run (gave_up). Comm actions: dl_side_fits. */
static bool dl_fits(dl_run *d, const zb_action *c) {
  const vctx *x = d->x;
  bool ok = !d->guarded || (c->stage >= 0 && c->stage < x->S && c->mb >= 0 && c->mb < x->m);
  if (!ok)
    d->gave_up = true;
  return ok;
}

/* Every rank's peers (the hosts of the stages next to its own, itself
 * left out) and the channels between them, for a lowered run. */
static void dl_channels_init(dl_run *d) {
  const vctx *x = d->x;
  int p = x->s->p, cap = d->cap = 2 * x->s->v;
  d->peer = zb_malloc(sizeof(int) * (size_t)p * (size_t)cap);
  d->in = zb_malloc(sizeof(int) * (size_t)p * (size_t)cap);
  d->npeer = zb_calloc((size_t)p, sizeof(int));
  d->chan = zb_calloc((size_t)p * (size_t)cap, sizeof *d->chan);
  d->posted = zb_calloc((size_t)p, sizeof(int));
  zb_schedule_peers(x->s, cap, d->peer, d->npeer);
  for (int r = 0; r < p; r++) /* neighbouring is mutual: r is among each peer's peers */
    for (int j = 0; j < d->npeer[r]; j++) {
      int q = d->peer[r * cap + j];
      for (int k = 0; k < d->npeer[q]; k++)
        if (d->peer[q * cap + k] == r)
          d->in[r * cap + j] = q * cap + k;
    }
}

static void dl_channels_free(dl_run *d) {
  if (d->chan)
    for (int c = 0; c < d->x->s->p * d->cap; c++)
      free(d->chan[c].tag);
  free(d->chan);
  free(d->posted);
  free(d->peer);
  free(d->npeer);
  free(d->in);
}

/* A comm action's fields, each taken out of its word once: whether it
 * sends, the transfer it is a side of as one number (direction,
 * producing stage, microbatch), its stage, the neighbouring stage and
 * its peer. */
typedef struct dl_side {
  bool send;
  uint64_t tag;
  int stage, other, mb, peer;
} dl_side;

static dl_side dl_side_of(const zb_action *a) {
  const zb_action c = *a;
  zb_op op = (zb_op)c.op;
  bool send = op == ZB_OP_SEND_F || op == ZB_OP_SEND_B, fwd = op == ZB_OP_SEND_F || op == ZB_OP_RECV_F;
  int stage = (int)c.stage, mb = (int)c.mb, other = stage + (fwd == send ? 1 : -1);
  uint64_t prod = (uint64_t)(send ? stage : other);
  return (dl_side){.send = send,
                   .tag = prod << 32 | (uint64_t)mb << 1 | fwd,
                   .stage = stage,
                   .other = other,
                   .mb = mb,
                   .peer = (int)c.peer};
}

/* Whether a guarded run may index by side c (its peer); an unguarded
 * run may always (the scan passed). One it may not ends the run. */
static bool dl_side_fits(dl_run *d, const dl_side *c) {
  const vctx *x = d->x;
  bool ok = !d->guarded ||
            (zb_in(c->stage, x->S) & zb_in(c->other, x->S) & zb_in(c->mb, x->m) & zb_in(c->peer, x->s->p));
  if (!ok)
    d->gave_up = true;
  return ok;
}

/* The channel side c of rank r posts on, or NULL when its peer is none
 * of r's (a guarded run then gives up; the scan names the peer). */
static dl_chan *dl_channel(dl_run *d, int r, const dl_side *c) {
  const int *peer = d->peer + (size_t)r * d->cap;
  for (int j = 0; j < d->npeer[r]; j++)
    if (peer[j] == c->peer)
      return &d->chan[c->send ? r * d->cap + j : d->in[r * d->cap + j]];
  d->gave_up = true;
  return NULL;
}

static void dl_chan_push(dl_chan *ch, uint64_t tag, bool sends) {
  if (ch->head + ch->n == ch->cap) {
    if (ch->head > 0)
      memmove(ch->tag, ch->tag + ch->head, sizeof *ch->tag * (size_t)ch->n);
    else
      ch->tag = zb_realloc(ch->tag, sizeof *ch->tag * (size_t)(ch->cap = ch->cap ? 2 * ch->cap : 4));
    ch->head = 0;
  }
  ch->tag[ch->head + ch->n++] = tag;
  ch->sends = sends;
}

/* c of rank r (at index i) met a partner that is another transfer's side
 * (tag): the run stops with a comm-mismatch. */
static void dl_mismatch(dl_run *d, int r, int i, const zb_action *c, uint64_t tag, bool sends) {
  int prod = (int)(tag >> 32), mb = (int)(tag >> 1 & 0x7fffffff);
  bool fwd = tag & 1;
  zb_op op = sends ? (fwd ? ZB_OP_SEND_F : ZB_OP_SEND_B) : (fwd ? ZB_OP_RECV_F : ZB_OP_RECV_B);
  int stage = sends ? prod : prod + (fwd ? 1 : -1);
  d->mismatch = true;
  viol(d->viol, ZB_VIOL_COMM_MISMATCH, r, i, c,
       "pairs with rank %d's %s stage %d mb %d: messages between two ranks pair up in posting order", c->peer,
       zb_op_name(op), stage, mb);
}

/* Posts rank r's group at pos, unless it is posted already; true when
 * the group completes. A member whose channel holds the partner side's
 * oldest unmet member meets it (and the partner's rank is woken once its
 * group has met all); any other is queued on its channel. The comm
 * checks before this run make every peer the transfer's partner. *end:
 * the group's last index (zb_comm_group_end, found on the way). */
static bool dl_post_group(dl_run *d, int r, int pos, int *end) {
  const zb_rank_list *l = &d->x->s->ranks[r];
  if (d->posted[r] > 0) { /* woken: done once every member has met its partner */
    *end = d->posted[r] - 1;
    if (d->missing[r] > 0)
      return false;
    d->posted[r] = 0;
    return true;
  }
  int missing = 0, k = pos;
  for (;; k++) {
    dl_side c = dl_side_of(&l->actions[k]);
    dl_chan *ch = dl_side_fits(d, &c) ? dl_channel(d, r, &c) : NULL;
    if (!ch)
      return false;
    if (ch->n == 0 || ch->sends == c.send) {
      dl_chan_push(ch, c.tag, c.send);
      missing++;
    } else {
      uint64_t met = ch->tag[ch->head++];
      ch->n--;
      if (met != c.tag) {
        dl_mismatch(d, r, k, &l->actions[k], met, !c.send);
        return false;
      }
      if (--d->missing[c.peer] == 0)
        dl_wake(d, c.peer);
    }
    if (!l->actions[k].batch || k + 1 == l->n || !zb_op_is_comm(l->actions[k + 1].op))
      break;
  }
  *end = k;
  d->missing[r] = missing;
  d->posted[r] = missing > 0 ? k + 1 : 0;
  return missing == 0;
}

/* Compute action a of a compute-only list on rank r, when its input was
 * produced: marks its output and wakes the rank that takes it. */
static bool dl_compute(dl_run *d, const zb_action *a) {
  const vctx *x = d->x;
  bool f = a->op == ZB_OP_F, b = a->op == ZB_OP_B || a->op == ZB_OP_BW;
  if (!(f || b))
    return true;
  if (!dl_fits(d, a))
    return false;
  if (f && a->stage > 0 && !d->done_f[dl_idx(x, a->stage - 1, a->mb)])
    return false;
  if (b && a->stage < x->S - 1 && !d->done_b[dl_idx(x, a->stage + 1, a->mb)])
    return false;
  if (f) {
    d->done_f[dl_idx(x, a->stage, a->mb)] = 1;
    if (a->stage + 1 < x->S)
      dl_wake(d, x->stage_rank[a->stage + 1]);
  } else {
    d->done_b[dl_idx(x, a->stage, a->mb)] = 1;
    if (a->stage > 0)
      dl_wake(d, x->stage_rank[a->stage - 1]);
  }
  return true;
}

/* Runs rank r's list as far as it goes. Its position stays in a local:
 * the done cells are bytes, and a store to them would otherwise make the
 * compiler read it back after each. */
static void dl_advance(dl_run *d, int r) {
  const zb_rank_list *l = &d->x->s->ranks[r];
  const bool lowered = d->x->lowered;
  int pos = d->pos[r];
  while (pos < l->n) {
    const zb_action *a = &l->actions[pos];
    if (pos + ZB_PREFETCH_ACTIONS < l->n) /* ranks take turns: too many streams for the hardware prefetcher */
      __builtin_prefetch(a + ZB_PREFETCH_ACTIONS);
    int end = pos;
    if (lowered && zb_op_is_comm(a->op)) { /* compute runs when reached: its inputs were received */
      if (!dl_post_group(d, r, pos, &end))
        break;
    } else if (!lowered && !dl_compute(d, a))
      break;
    pos = end + 1;
  }
  d->pos[r] = pos;
}

/* done: zeroed scratch of 2*S*m cells for compute-only lists (done_f,
 * then done_b), NULL for lowered ones. guarded: the run goes before the
 * scan (dl_fits); *gave_up then says that it stopped on an action out of
 * range, and its verdict means nothing. */
static zb_err check_deadlock(const vctx *x, unsigned char *done, bool guarded, bool *gave_up,
                             zb_violation *out) {
  int p = x->s->p;
  dl_run d = {.x = x,
              .guarded = guarded,
              .done_f = done,
              .done_b = done ? done + (size_t)x->S * x->m : NULL,
              .pos = zb_calloc((size_t)p, sizeof(int)),
              .work = zb_malloc(sizeof(int) * (size_t)p),
              .missing = zb_calloc((size_t)p, sizeof(int)),
              .queued = zb_calloc((size_t)p, sizeof(bool)),
              .viol = out};
  if (x->lowered)
    dl_channels_init(&d);
  for (int r = p - 1; r >= 0; r--)
    dl_wake(&d, r);
  while (d.n_work > 0 && !d.gave_up && !d.mismatch) {
    int r = d.work[--d.n_work];
    d.queued[r] = true; /* a wake while it advances changes nothing */
    dl_advance(&d, r);
    d.queued[r] = false;
  }
  zb_err err = d.mismatch && !d.gave_up ? ZB_ERR_INVALID_SCHEDULE : ZB_OK;
  *gave_up = d.gave_up;
  for (int r = 0; r < p && !err && !d.gave_up; r++)
    if (d.pos[r] < x->s->ranks[r].n)
      err = viol(out, ZB_VIOL_DEADLOCK, r, d.pos[r], &x->s->ranks[r].actions[d.pos[r]],
                 x->lowered ? "blocked: its communication partner never posts the matching operation"
                            : "blocked: its input is produced only after this rank's later work");
  dl_channels_free(&d);
  free(d.pos);
  free(d.missing);
  free(d.work);
  free(d.queued);
  return err;
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
      !(err = check_missing(x, out)) && !(err = report(x, ZB_VIOL_DEPENDENCY, out)) &&
      !(err = report(x, ZB_VIOL_COMM_MISMATCH, out)))
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
    j->run_err = check_deadlock(j->x, j->done, true, &j->gave_up, &j->run_v);
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
    err = check_deadlock(x, j.done, false, &j.gave_up, out);
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
  for (int st = 0; st < x.S; st++)
    x.stage_rank[st] = zb_stage_rank(s, st);
  zb_err err = validate_run(&x, par, out);
  free(x.cell);
  free(x.stage_rank);
  return err;
}
