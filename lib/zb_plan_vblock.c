/* V-Half and V-Min from a repeating building block (docs/schedules.md,
 * V families; the construction of "Pipeline Parallelism with Controllable
 * Memory", Qi et al. 2024).
 *
 * One microbatch's passes over the V, laid out in unit slots: F of chunk 0
 * walks down the ranks, turns at rank p-1 into F of chunk 1 walking back
 * up, turns at rank 0 (after a gap g) into B of chunk 1 walking down and B
 * of chunk 0 walking back up. The block repeats every 6 slots (a rank's
 * F, F, B, B of one microbatch plus its two W), so in the steady state
 * every rank is busy. How long a rank holds a microbatch's activations
 * (the block's lifespan on it) sets the peak memory: F of chunk 0 and B of
 * chunk 1 advance one rank per `hop` slots, so hop 1 packs the block
 * tightest (V-Min, about p/3 of 1F1B's activations) and hop 2 stretches
 * it (V-Half, about p/2). g is the smallest delay at the bottom of the V
 * that keeps a rank's four slots apart modulo 6.
 *
 * Each W goes into the first free slot after its B, so memory is freed as
 * early as the block allows. Repeating the block leaves the warm-up and
 * the cool-down full of empty slots; the squeeze moves every pass, in slot
 * order, to the earliest free slot after its inputs (and after the same
 * pass of the previous microbatch) where the rank's memory stays within
 * the limit. The ops of a rank in slot order are its list. Several
 * spacings (g, and a delay at the V's other turn) are tried, squeezed and
 * not, and the best under the real costs is kept.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_plan_internal.h"

#define VB_PERIOD 6
#define VB_KINDS 6 /* F0, F1, B1, B0 (the block), then W0, W1 */

/* Slot offsets of rank r's four passes of microbatch 0. */
typedef struct vb_offsets {
  int at[4]; /* F chunk 0, F chunk 1, B chunk 1, B chunk 0 */
} vb_offsets;

static const zb_op vb_op[VB_KINDS] = {ZB_OP_F, ZB_OP_F, ZB_OP_B, ZB_OP_B, ZB_OP_W, ZB_OP_W};
static const int vb_chunk[VB_KINDS] = {0, 1, 1, 0, 0, 1};

/* g delays the bottom turn (rank 0: B of the last stage after its F), h
 * the top one (rank p-1: B of chunk 0 after B of chunk 1). */
static vb_offsets vb_offsets_of(int p, int hop, int g, int h, int r) {
  int turn_f = hop * (p - 1) + 1;
  int turn_b = turn_f + (p - 1) + 1 + g;
  int turn_b0 = turn_b + hop * (p - 1) + 1 + h;
  vb_offsets o = {{hop * r, turn_f + (p - 1 - r), turn_b + hop * r, turn_b0 + (p - 1 - r)}};
  return o;
}

/* Whether every rank's four slots differ modulo the period. */
static bool vb_fits(int p, int hop, int g, int h) {
  for (int r = 0; r < p; r++) {
    vb_offsets o = vb_offsets_of(p, hop, g, h, r);
    bool used[VB_PERIOD] = {false};
    for (int k = 0; k < 4; k++) {
      int slot = o.at[k] % VB_PERIOD;
      if (used[slot])
        return false;
      used[slot] = true;
    }
  }
  return true;
}

/* The block laid out in slots: for every rank, pass kind and microbatch,
 * its slot; for every rank and slot, what runs there. */
typedef struct vb_grid {
  int p, m, T;
  int *slot;            /* [(r * VB_KINDS + kind) * m + mb] */
  int *at;              /* [r * T + t]: kind * m + mb, or -1 when free */
  double mem[VB_KINDS]; /* per kind, the memory delta on rank 0's stages (scaled per rank below) */
} vb_grid;

static int *vb_slot(vb_grid *g, int r, int kind, int mb) {
  return &g->slot[((size_t)r * VB_KINDS + (size_t)kind) * (size_t)g->m + (size_t)mb];
}

static void vb_put(vb_grid *g, int r, int kind, int mb, int t) {
  *vb_slot(g, r, kind, mb) = t;
  g->at[(size_t)r * (size_t)g->T + (size_t)t] = kind * g->m + mb;
}

/* Rank r's passes at their block slots, each W in the first free slot
 * after its B (first in, first out). */
static void vb_layout_rank(vb_grid *g, vb_offsets o, int r, int *wq) {
  int head = 0, tail = 0, m = g->m;
  const int *row = &g->at[(size_t)r * (size_t)g->T];
  for (int k = 0; k < 4; k++)
    for (int mb = 0; mb < m; mb++)
      vb_put(g, r, k, mb, o.at[k] + VB_PERIOD * mb);
  for (int t = 0; t < g->T; t++) {
    int w = row[t];
    if (w >= 2 * m)
      wq[tail++] = (w < 3 * m ? 5 : 4) * m + w % m; /* W1 after B1, W0 after B0 */
    else if (w < 0 && head < tail) {
      int x = wq[head++];
      vb_put(g, r, x / m, x % m, t);
    }
  }
}

/* The earliest slot (r, kind, mb) may take: after its inputs and after the
 * same pass of the previous microbatch. */
static int vb_ready(vb_grid *g, int r, int k, int mb) {
  static const int chain_dir[4] = {-1, +1, -1, +1}; /* where a pass's input comes from */
  static const int turn_from[4] = {-1, 0, 1, 2};    /* at the end of the chain: the pass before */
  int t = mb > 0 ? *vb_slot(g, r, k, mb - 1) + 1 : 0, from;
  if (k >= 4) {
    from = *vb_slot(g, r, k == 4 ? 3 : 2, mb); /* W after its B */
  } else {
    int q = r + chain_dir[k];
    if (q >= 0 && q < g->p)
      from = *vb_slot(g, q, k, mb);
    else
      from = turn_from[k] < 0 ? -1 : *vb_slot(g, r, turn_from[k], mb);
  }
  return from + 1 > t ? from + 1 : t;
}

/* Moves rank r's pass at slot t to the earliest free slot from its ready
 * time on where the rank's memory stays within lim. mem[t] is the rank's
 * memory after slot t; hi is scratch for suffix maxima. */
static void vb_squeeze_one(vb_grid *g, int r, int t, const double *delta, double lim, double *mem,
                           double *hi) {
  int *row = &g->at[(size_t)r * (size_t)g->T], who = row[t], k = who / g->m, mb = who % g->m;
  int ready = vb_ready(g, r, k, mb);
  if (ready >= t)
    return;
  double d = delta[k], best_hi = -INFINITY;
  bool check = d > 0 && lim > 0; /* only an op that holds memory can break the limit */
  for (int u = t - 1; check && u >= ready; u--)
    hi[u] = best_hi = mem[u] > best_hi ? mem[u] : best_hi;
  int u = ready;
  while (u < t && (row[u] >= 0 || (check && hi[u] + d > lim + 1e-9)))
    u++;
  if (u == t)
    return;
  row[t] = -1;
  vb_put(g, r, k, mb, u);
  for (int x = u; d != 0 && x < t; x++)
    mem[x] += d;
}

/* Squeezes every pass, in slot order, towards its inputs. */
static void vb_squeeze(vb_grid *g, const zb_costs *c) {
  int p = g->p, T = g->T;
  double *mem = zb_malloc(sizeof(double) * (size_t)p * (size_t)T),
         *hi = zb_malloc(sizeof(double) * (size_t)T);
  double *delta = zb_malloc(sizeof(double) * (size_t)p * VB_KINDS);
  for (int r = 0; r < p; r++) {
    int stage[2] = {r, 2 * p - 1 - r};
    for (int k = 0; k < VB_KINDS; k++)
      delta[r * VB_KINDS + k] = zb_costs_mem(c, vb_op[k], stage[vb_chunk[k]]);
    double cur = 0;
    for (int t = 0; t < T; t++) {
      int w = g->at[(size_t)r * (size_t)T + (size_t)t];
      cur += w >= 0 ? delta[r * VB_KINDS + w / g->m] : 0;
      mem[(size_t)r * (size_t)T + (size_t)t] = cur;
    }
  }
  for (int t = 0; t < T; t++)
    for (int r = 0; r < p; r++)
      if (g->at[(size_t)r * (size_t)T + (size_t)t] >= 0)
        vb_squeeze_one(g, r, t, &delta[r * VB_KINDS], c->mem_limit, &mem[(size_t)r * (size_t)T], hi);
  free(mem);
  free(hi);
  free(delta);
}

/* The lists: every rank's passes in slot order. */
static zb_schedule *vb_emit(const vb_grid *g) {
  zb_schedule *s = zb_schedule_new(g->p, 2, g->m, ZB_PLACE_V);
  for (int r = 0; r < g->p; r++) {
    int stage[2] = {r, 2 * g->p - 1 - r};
    for (int t = 0; t < g->T; t++) {
      int w = g->at[(size_t)r * (size_t)g->T + (size_t)t];
      if (w >= 0)
        zb_schedule_push_op(s, r, vb_op[w / g->m], stage[vb_chunk[w / g->m]], w % g->m);
    }
  }
  return s;
}

/* Lays the block out with spacing (g, h); NULL grid fields on failure. */
static bool vb_layout(vb_grid *grid, int p, int m, int hop, int g, int h) {
  int last = 0;
  for (int r = 0; r < p; r++) {
    vb_offsets o = vb_offsets_of(p, hop, g, h, r);
    for (int k = 0; k < 4; k++)
      last = o.at[k] > last ? o.at[k] : last;
  }
  *grid = (vb_grid){.p = p, .m = m, .T = last + VB_PERIOD * m + 2 * m + 1};
  grid->slot = zb_malloc(sizeof(int) * (size_t)p * VB_KINDS * (size_t)m);
  grid->at = zb_malloc(sizeof(int) * (size_t)p * (size_t)grid->T);
  memset(grid->at, 0xff, sizeof(int) * (size_t)p * (size_t)grid->T);
  int *wq = zb_malloc(sizeof(int) * 2 * (size_t)m);
  for (int r = 0; r < p; r++)
    vb_layout_rank(grid, vb_offsets_of(p, hop, g, h, r), r, wq);
  free(wq);
  return true;
}

/* Whether the block with spacing (g, h), as laid out, fits the memory
 * limit: the spacings worth squeezing. */
static bool vb_raw_fits(const vb_grid *g, const zb_costs *c) {
  double lim = c->mem_limit;
  for (int r = 0; r < g->p && lim > 0; r++) {
    int stage[2] = {r, 2 * g->p - 1 - r};
    double mem = 0;
    for (int t = 0; t < g->T; t++) {
      int w = g->at[(size_t)r * (size_t)g->T + (size_t)t];
      if (w >= 0 && (mem += zb_costs_mem(c, vb_op[w / g->m], stage[vb_chunk[w / g->m]])) > lim + 1e-9)
        return false;
    }
  }
  return true;
}

zb_schedule *zb_plan_v_block(int p, int m, int hop, const zb_costs *c, zb_plan_score *score) {
  zb_schedule *best = NULL;
  zb_plan_score best_score;
  /* the tightest spacings whose block fits the limit as laid out: the
   * squeeze keeps it within, and W placed by timing then decides; one on
   * large plans, where the second gained at most 0.2% in the grids */
  int tries = (double)p * m > 4096 ? 1 : 2;
  for (int sum = 0; sum < 3 * VB_PERIOD && tries > 0; sum++)
    for (int h = 0; h <= sum && tries > 0; h++) {
      int g = sum - h;
      if (!vb_fits(p, hop, g, h))
        continue;
      vb_grid grid;
      vb_layout(&grid, p, m, hop, g, h);
      if (vb_raw_fits(&grid, c)) {
        tries--;
        vb_squeeze(&grid, c);
        zb_schedule *order = vb_emit(&grid);
        zb_plan_score sc;
        zb_schedule *timed = zb_plan_place_w(order, c, ZB_W_GAP, &sc);
        zb_schedule_free(order);
        zb_plan_keep(&best, &best_score, timed, &sc, c, ZB_OBJ_MAKESPAN);
      }
      free(grid.slot);
      free(grid.at);
    }
  if (best && score)
    *score = best_score;
  return best;
}
