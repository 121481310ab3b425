/* DualPipeV (dualpipe-v): DeepSeek's DualPipe cut in half onto V placement,
 * as PyTorch 2.15's ScheduleDualPipeV lists it (docs/schedules.md,
 * Families). Rank r hosts stage r (chunk 0) and 2p-1-r (chunk 1). Its list
 * has eight phases:
 *   1. 2(p-r-1) chunk-0 forwards;
 *   2. r+1 pairs of a chunk-0 and a chunk-1 forward;
 *   3. p-r-1 times: chunk-1 B, its W, a chunk-1 forward;
 *   4. m-2p+r+1 times: a chunk-0 forward overlapped with a chunk-1 full
 *      backward, then a chunk-1 forward overlapped with a chunk-0 one (the
 *      last rank's first pair runs apart: its chunk-1 backward needs that
 *      very forward);
 *   5. p-r-1 times: a chunk-1 full backward, then a chunk-1 forward
 *      overlapped with a chunk-0 full backward;
 *   6. r+1 times a chunk-1 then a chunk-0 backward, split into B and W from
 *      half-way (from before the chunk-1 one on odd ranks, after it on
 *      even ones);
 *   7. p-r-1 times: a pending W, then a split chunk-0 backward;
 *   8. the r+1 W still pending.
 * W ops run first in, first out. Overlapped pairs carry the `overlap` flag
 * on their first action. Needs m >= 2p-1. */
#include <stdlib.h>

#include "zb_alloc.h"
#include "zb_plan_internal.h"

typedef struct dpv_rank {
  zb_schedule *s;
  int r, stage[2];
  int f[2], b[2]; /* next microbatch of each chunk's F and backward */
  bool split;     /* backwards split into B and W from now on */
  int *w_stage, *w_mb, w_head, w_tail;
} dpv_rank;

static void dpv_f(dpv_rank *x, int chunk, bool overlap) {
  zb_schedule_push_op(x->s, x->r, ZB_OP_F, x->stage[chunk], x->f[chunk]++);
  x->s->ranks[x->r].actions[x->s->ranks[x->r].n - 1].overlap = overlap;
}

/* A backward of chunk: fused BW, or B with its W queued when split. */
static void dpv_b(dpv_rank *x, int chunk) {
  int mb = x->b[chunk]++;
  zb_schedule_push_op(x->s, x->r, x->split ? ZB_OP_B : ZB_OP_BW, x->stage[chunk], mb);
  if (x->split) {
    x->w_stage[x->w_tail] = x->stage[chunk];
    x->w_mb[x->w_tail++] = mb;
  }
}

static void dpv_w(dpv_rank *x) {
  if (x->w_head < x->w_tail) {
    zb_schedule_push_op(x->s, x->r, ZB_OP_W, x->w_stage[x->w_head], x->w_mb[x->w_head]);
    x->w_head++;
  }
}

static void dpv_rank_list(dpv_rank *x, int p, int m) {
  int r = x->r;
  for (int i = 0; i < 2 * (p - r - 1); i++)
    dpv_f(x, 0, false);
  for (int i = 0; i < r + 1; i++) {
    dpv_f(x, 0, false);
    dpv_f(x, 1, false);
  }
  for (int i = 0; i < p - r - 1; i++) {
    x->split = true;
    dpv_b(x, 1);
    x->split = false;
    dpv_w(x);
    dpv_f(x, 1, false);
  }
  for (int i = 0; i < m - 2 * p + r + 1; i++) {
    dpv_f(x, 0, !(i == 0 && r == p - 1));
    dpv_b(x, 1);
    dpv_f(x, 1, true);
    dpv_b(x, 0);
  }
  for (int i = 0; i < p - r - 1; i++) {
    dpv_b(x, 1);
    dpv_f(x, 1, true);
    dpv_b(x, 0);
  }
  for (int i = 0; i < r + 1; i++) {
    x->split |= i == (r + 1) / 2 && r % 2 == 1;
    dpv_b(x, 1);
    x->split |= i == (r + 1) / 2 && r % 2 == 0;
    dpv_b(x, 0);
  }
  for (int i = 0; i < p - r - 1; i++) {
    dpv_w(x);
    dpv_b(x, 0);
  }
  while (x->w_head < x->w_tail)
    dpv_w(x);
}

zb_schedule *zb_plan_dualpipe_v(int p, int m) {
  zb_schedule *s = zb_schedule_new_room(p, 2, m, ZB_PLACE_V, 6);
  int *ws = zb_malloc(sizeof(int) * 2 * (size_t)m), *wm = zb_malloc(sizeof(int) * 2 * (size_t)m);
  for (int r = 0; r < p; r++) {
    dpv_rank x = {.s = s, .r = r, .stage = {r, 2 * p - 1 - r}, .w_stage = ws, .w_mb = wm};
    dpv_rank_list(&x, p, m);
  }
  free(ws);
  free(wm);
  return s;
}
