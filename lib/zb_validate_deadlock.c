/* zb_validate_deadlock.c — the validator's deadlock run
 * (zb_validate_internal.h): every list played out under the transports'
 * rules until each rank is done or waits on a partner that never comes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_validate_internal.h"

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
   * channel r -> peer j is chan[r * cap + j]; side[2 * (r * cap + j) + s]
   * is the channel r's sends (s = 1) or receives (s = 0) with peer j
   * go on, one look-up for either */
  int cap, *peer, *npeer;
  dl_chan *chan, **side;
  bool guarded;  /* before the scan vouched for the lists: check each index (dl_fits, dl_side_fits) */
  bool gave_up;  /* guarded, and an action would index out of range */
  bool mismatch; /* two members met that are not one transfer: in *viol */
  zb_violation *viol;
} dl_run;

/* A cell of done_f/done_b: microbatch-major, unlike vidx, as the ranks
 * take turns here and neighbouring stages reach a microbatch at about the
 * same time (the scan goes rank by rank, along a stage's row). */
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
  d->side = zb_malloc(sizeof *d->side * 2 * (size_t)p * (size_t)cap);
  d->npeer = zb_calloc((size_t)p, sizeof(int));
  d->chan = zb_calloc((size_t)p * (size_t)cap, sizeof *d->chan);
  d->posted = zb_calloc((size_t)p, sizeof(int));
  zb_schedule_peers(x->s, cap, d->peer, d->npeer);
  for (int r = 0; r < p; r++) /* neighbouring is mutual: r is among each peer's peers */
    for (int j = 0; j < d->npeer[r]; j++) {
      int q = d->peer[r * cap + j];
      d->side[2 * (r * cap + j) + 1] = &d->chan[r * cap + j];
      for (int k = 0; k < d->npeer[q]; k++)
        if (d->peer[q * cap + k] == r)
          d->side[2 * (r * cap + j)] = &d->chan[q * cap + k];
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
  free(d->side);
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
      return d->side[2 * (r * d->cap + j) + c->send];
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
  zb_validate_violation(
      d->viol, ZB_VIOL_COMM_MISMATCH, r, i, c,
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

/* See zb_validate_internal.h; a guarded run checks indexes with dl_fits
 * and dl_side_fits. */
zb_err zb_validate_deadlock(const vctx *x, unsigned char *done, bool guarded, bool *gave_up,
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
      err = zb_validate_violation(
          out, ZB_VIOL_DEADLOCK, r, d.pos[r], &x->s->ranks[r].actions[d.pos[r]],
          x->lowered ? "blocked: its communication partner never posts the matching operation"
                     : "blocked: its input is produced only after this rank's later work");
  dl_channels_free(&d);
  free(d.pos);
  free(d.missing);
  free(d.work);
  free(d.queued);
  return err;
}
