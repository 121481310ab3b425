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
 * the limit. The ops of a rank in slot order are its list.
 *
 * A second squeeze, after the Zero Bubble authors' V-Half generator, holds
 * the steady stretch where the block put it (moving its passes reshuffles
 * the F and B order, which the real costs can make slower: in slot
 * order 3.3 time units per microbatch instead of 3.0 at p = 16 under
 * 1:1.2:0.8:0.05), then lifts every W out, each to
 * run in the first free slot after its B, and squeezes the cool-down
 * again. Several spacings (g, and a delay at the V's other turn) are
 * tried, with both squeezes, and the best under the real costs is kept.
 */
#include <limits.h>
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
  int *slot;            /* [(mb * p + r) * VB_KINDS + kind] (vb_slot) */
  int *at;              /* [r * T + t]: kind * m + mb, or -1 when free */
  double mem[VB_KINDS]; /* per kind, the memory delta on rank 0's stages (scaled per rank below) */
} vb_grid;

static int *vb_slot(vb_grid *g, int r, int kind, int mb) {
  /* microbatch-major: a pass reads its neighbours' slots of the same
   * microbatch and its own of the previous one, which this keeps within a
   * few pages rather than one page per rank and kind */
  return &g->slot[((size_t)mb * (size_t)g->p + (size_t)r) * VB_KINDS + (size_t)kind];
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

/* ---- a rank's memory over its slots, kept in blocks ----
 * Moving a pass from slot t to an earlier u changes the memory after every
 * slot in [u, t) by its delta, and an F may only go where the highest of
 * those stays within the limit. V-Half's passes move about 2p slots each
 * (3 billion slot updates at p = 256, m = 4096, one by one); blocks of
 * VB_BLK slots, each with an add pending on all of it, its maximum and
 * its free slots, turn both walks into one over blocks plus the two part
 * blocks at the ends. */
#define VB_BLK 32

typedef struct vb_prof {
  double *mem; /* [t]: memory after slot t, less its block's pending add */
  double *add; /* [b]: pending on every slot of block b */
  double *top; /* [b]: the largest mem of block b (add not included) */
  int *free_n; /* [b]: free slots of block b */
  int T;
} vb_prof;

static void vb_prof_retop(vb_prof *pr, int b) {
  int end = (b + 1) * VB_BLK < pr->T ? (b + 1) * VB_BLK : pr->T;
  double top = -INFINITY;
  for (int x = b * VB_BLK; x < end; x++)
    top = pr->mem[x] > top ? pr->mem[x] : top;
  pr->top[b] = top;
}

/* Adds d to mem over [u, t) inside one block; its top stays an upper
 * bound (exact again when a search reads the whole block). */
static void vb_prof_add_part(vb_prof *pr, int u, int t, double d) {
  double top = pr->top[u / VB_BLK];
  for (int x = u; x < t; x++) {
    pr->mem[x] += d;
    top = pr->mem[x] > top ? pr->mem[x] : top;
  }
  pr->top[u / VB_BLK] = top;
}

/* Adds d to the memory after every slot of [u, t). */
static void vb_prof_add(vb_prof *pr, int u, int t, double d) {
  int bu = u / VB_BLK, bt = t / VB_BLK;
  vb_prof_add_part(pr, u, bu == bt ? t : (bu + 1) * VB_BLK, d);
  if (bu == bt)
    return;
  for (int b = bu + 1; b < bt; b++)
    pr->add[b] += d;
  if (bt * VB_BLK < t)
    vb_prof_add_part(pr, bt * VB_BLK, t, d);
}

/* The last slot of [lo, hi) whose memory plus d exceeds lim; -1: none. */
static int vb_prof_last_over(vb_prof *pr, int lo, int hi, double d, double lim) {
  for (int x = hi - 1; x >= lo;) {
    int b = x / VB_BLK, start = b * VB_BLK, stop = start > lo ? start : lo;
    bool whole = stop == start && x == start + VB_BLK - 1;
    if (whole && pr->top[b] + pr->add[b] + d <= lim) {
      x = start - 1; /* the whole block is within */
      continue;
    }
    for (; x >= stop; x--)
      if (pr->mem[x] + pr->add[b] + d > lim)
        return x;
    if (whole) /* read in full and within: its bound was stale */
      vb_prof_retop(pr, b);
  }
  return -1;
}

/* The first free slot of row in [lo, hi); hi: none. */
static int vb_prof_first_free(const vb_prof *pr, const int *row, int lo, int hi) {
  for (int x = lo; x < hi;) {
    int b = x / VB_BLK;
    if (x == b * VB_BLK && pr->free_n[b] == 0) {
      x += VB_BLK;
      continue;
    }
    int stop = (b + 1) * VB_BLK < hi ? (b + 1) * VB_BLK : hi;
    for (; x < stop; x++)
      if (row[x] < 0)
        return x;
  }
  return hi;
}

/* Rank r's profile (pr's arrays allocated for T slots): memory after each
 * slot as laid out, nothing pending, the free slots counted. */
static void vb_prof_init(vb_prof *pr, const int *row, const double *delta, int m) {
  double cur = 0;
  int nb = (pr->T + VB_BLK - 1) / VB_BLK;
  for (int b = 0; b < nb; b++)
    pr->add[b] = 0, pr->free_n[b] = 0;
  for (int t = 0; t < pr->T; t++) {
    cur += row[t] >= 0 ? delta[row[t] / m] : 0;
    pr->mem[t] = cur;
    pr->free_n[t / VB_BLK] += row[t] < 0;
  }
  for (int b = 0; b < nb; b++)
    vb_prof_retop(pr, b);
}

/* Moves rank r's pass at slot t to the earliest free slot from its ready
 * time on where the rank's memory stays within lim (pr: the rank's). */
static void vb_squeeze_one(vb_grid *g, int r, int t, const double *delta, double lim, vb_prof *pr) {
  int *row = &g->at[(size_t)r * (size_t)g->T], who = row[t], k = who / g->m, mb = who % g->m;
  int ready = vb_ready(g, r, k, mb);
  if (ready >= t)
    return;
  double d = delta[k];
  int lo = ready;
  if (d > 0 && lim > 0) { /* only an op that holds memory can break the limit */
    int over = vb_prof_last_over(pr, ready, t, d, lim + 1e-9);
    lo = over >= 0 ? over + 1 : ready;
  }
  int u = vb_prof_first_free(pr, row, lo, t);
  if (u >= t)
    return;
  row[t] = -1;
  vb_put(g, r, k, mb, u);
  pr->free_n[t / VB_BLK]++;
  pr->free_n[u / VB_BLK]--;
  if (d != 0)
    vb_prof_add(pr, u, t, d);
}

/* Every rank's memory delta per pass kind: [r * VB_KINDS + kind]. */
static double *vb_deltas(int p, const zb_costs *c) {
  double *delta = zb_malloc(sizeof(double) * (size_t)p * VB_KINDS);
  for (int r = 0; r < p; r++) {
    int stage[2] = {r, 2 * p - 1 - r};
    for (int k = 0; k < VB_KINDS; k++)
      delta[r * VB_KINDS + k] = zb_costs_mem(c, vb_op[k], stage[vb_chunk[k]]);
  }
  return delta;
}

/* The steady stretch of g as it stands, in the order the squeezes go in
 * (slot by slot, ranks in turn; key slot * p + rank): from rank 0's
 * first chunk-0 B to the first chunk-0 F of the last microbatch at or
 * after it, both in. */
static void vb_steady(vb_grid *g, long long *open, long long *close) {
  long long p = g->p;
  *open = *vb_slot(g, 0, 3, 0) * p;
  *close = LLONG_MAX;
  for (int r = 0; r < g->p; r++) {
    long long key = *vb_slot(g, r, 0, g->m - 1) * p + r;
    if (key >= *open && key < *close)
      *close = key;
  }
}

/* Squeezes every pass, in slot order, towards its inputs; with hold, the
 * passes of the steady stretch (vb_steady) keep their slots. */
static void vb_squeeze(vb_grid *g, const zb_costs *c, bool hold) {
  int p = g->p, T = g->T, nb = (T + VB_BLK - 1) / VB_BLK;
  double *mem = zb_malloc(sizeof(double) * (size_t)p * (size_t)T);
  double *blocks = zb_malloc(sizeof(double) * 2 * (size_t)p * (size_t)nb);
  int *free_n = zb_malloc(sizeof(int) * (size_t)p * (size_t)nb);
  double *delta = vb_deltas(p, c);
  vb_prof *prof = zb_malloc(sizeof *prof * (size_t)p);
  long long open = LLONG_MAX, close = LLONG_MAX;
  if (hold)
    vb_steady(g, &open, &close);
  for (int r = 0; r < p; r++) {
    size_t o = (size_t)r * (size_t)nb;
    prof[r] = (vb_prof){.mem = &mem[(size_t)r * (size_t)T],
                        .add = &blocks[2 * o],
                        .top = &blocks[2 * o + (size_t)nb],
                        .free_n = &free_n[o],
                        .T = T};
    vb_prof_init(&prof[r], &g->at[(size_t)r * (size_t)T], &delta[r * VB_KINDS], g->m);
  }
  /* Slot by slot, the ranks with a pass there as laid out (moves only go
   * to slots already done, so that is what each slot holds when reached):
   * gathered rank by rank first, as stepping through the ranks at every
   * slot would touch a page per rank per slot. */
  int *first = zb_calloc((size_t)T + 1, sizeof(int)), *ranks = NULL;
  for (int r = 0; r < p; r++)
    for (int t = 0; t < T; t++)
      first[t + 1] += g->at[(size_t)r * (size_t)T + (size_t)t] >= 0;
  for (int t = 0; t < T; t++)
    first[t + 1] += first[t];
  ranks = zb_malloc(sizeof(int) * (size_t)(first[T] > 0 ? first[T] : 1));
  int *fill = zb_malloc(sizeof(int) * (size_t)T);
  memcpy(fill, first, sizeof(int) * (size_t)T);
  for (int r = 0; r < p; r++)
    for (int t = 0; t < T; t++)
      if (g->at[(size_t)r * (size_t)T + (size_t)t] >= 0)
        ranks[fill[t]++] = r;
  for (int t = 0; t < T; t++)
    for (int i = first[t]; i < first[t + 1]; i++) {
      long long key = (long long)t * p + ranks[i];
      if (key < open || key > close)
        vb_squeeze_one(g, ranks[i], t, &delta[ranks[i] * VB_KINDS], c->mem_limit, &prof[ranks[i]]);
    }
  free(first);
  free(ranks);
  free(fill);
  free(prof);
  free(mem);
  free(blocks);
  free(free_n);
  free(delta);
}

/* The lists: every rank's passes in slot order. */
static zb_schedule *vb_emit(const vb_grid *g) {
  zb_schedule *s = zb_schedule_new_room(g->p, 2, g->m, ZB_PLACE_V, 6);
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

/* ---- the cool-down once more, W lifted ----
 * With the steady stretch held, the squeeze leaves the cool-down's W
 * where they were laid out or moved, in slots an F or B could take. As
 * the Zero Bubble authors' V-Half generator reorders its pattern: every
 * W is lifted out, each to run in the first free slot after its B
 * (first in, first out), and the cool-down's passes move, in slot order,
 * to the earliest free slot after their inputs where the rank's memory,
 * with the W run that way, stays within the limit. */
typedef struct vb_lift {
  double *mem; /* [t]: memory after slot t, W lifted */
  int *wait;   /* [t]: W waiting for a free slot after slot t */
  int *fifo;   /* scratch: the waiting W's kinds, oldest first (2m) */
  int last;    /* the rank's last pass is at or before it */
} vb_lift;

/* Walks row (W lifted) from slot u on and says whether its memory stays
 * within lim; lf holds its figures before u. With write, stores the
 * figures from u on in lf. When the rank's two W free alike, the walk
 * starts at u and ends where it meets lf's figures again at or after t
 * (the rest is unchanged); else it starts at 0 and runs to the end. */
static bool vb_lift_walk(const int *row, int m, const double *delta, double lim, vb_lift *lf, int u, int t,
                         bool write) {
  bool alike = delta[4] == delta[5];
  int x = alike ? u : 0, head = 0, tail = 0;
  double mem = x > 0 ? lf->mem[x - 1] : 0;
  for (int k = 0, n = x > 0 ? lf->wait[x - 1] : 0; k < n; k++)
    lf->fifo[tail++] = 4; /* alike: which kind does not matter */
  for (; x <= lf->last; x++) {
    int who = row[x], k = who / m;
    if (who >= 0) {
      mem += delta[k];
      if (k == 2 || k == 3)
        lf->fifo[tail++] = k == 2 ? 5 : 4; /* W1 after B1, W0 after B0 */
    } else if (head < tail)
      mem += delta[lf->fifo[head++]];
    if (lim > 0 && mem > lim + 1e-9)
      return false;
    if (alike && x >= t && lf->wait[x] == tail - head)
      return true;
    if (write)
      lf->mem[x] = mem, lf->wait[x] = tail - head;
  }
  return true;
}

/* Moves rank r's pass at slot t to the earliest free slot from its ready
 * time on where the rank's memory, W lifted, stays within lim. */
static void vb_lift_one(vb_grid *g, int r, int t, const double *delta, double lim, vb_lift *lf) {
  int *row = &g->at[(size_t)r * (size_t)g->T], who = row[t], k = who / g->m, mb = who % g->m;
  for (int u = vb_ready(g, r, k, mb); u < t; u++) {
    if (row[u] >= 0)
      continue;
    row[t] = -1, row[u] = who;
    if (lim <= 0 || vb_lift_walk(row, g->m, delta, lim, lf, u, t, false)) {
      *vb_slot(g, r, k, mb) = u;
      if (lim > 0 && delta[4] == delta[5])
        vb_lift_walk(row, g->m, delta, 0, lf, u, t, true);
      return;
    }
    row[u] = -1, row[t] = who;
  }
}

/* The squeezed grid (steady stretch held) with its W lifted and the
 * cool-down squeezed again: the lists, W in the first free slots. */
static zb_schedule *vb_lift_cooldown(vb_grid *g, const zb_costs *c) {
  int p = g->p, T = g->T, m = g->m;
  double *delta = vb_deltas(p, c);
  vb_lift *lf = zb_malloc(sizeof *lf * (size_t)p);
  double *mem = zb_malloc(sizeof(double) * (size_t)p * (size_t)T);
  int *wait = zb_malloc(sizeof(int) * (size_t)p * (size_t)T), *fifo = zb_malloc(sizeof(int) * 2 * (size_t)m);
  for (int r = 0; r < p; r++) {
    int *row = &g->at[(size_t)r * (size_t)T];
    lf[r] = (vb_lift){.mem = &mem[(size_t)r * (size_t)T], .wait = &wait[(size_t)r * (size_t)T], .fifo = fifo};
    for (int t = 0; t < T; t++) {
      row[t] = row[t] >= 4 * m ? -1 : row[t];
      lf[r].last = row[t] >= 0 ? t : lf[r].last;
    }
    vb_lift_walk(row, m, &delta[r * VB_KINDS], 0, &lf[r], 0, T, true);
  }
  long long open, close;
  vb_steady(g, &open, &close);
  for (int t = close == LLONG_MAX ? T : (int)(close / p); t < T; t++)
    for (int r = 0; r < p; r++)
      if ((long long)t * p + r > close && g->at[(size_t)r * (size_t)T + (size_t)t] >= 0)
        vb_lift_one(g, r, t, &delta[r * VB_KINDS], c->mem_limit, &lf[r]);
  zb_schedule *s = zb_schedule_new_room(p, 2, m, ZB_PLACE_V, 6);
  for (int r = 0; r < p; r++) {
    int stage[2] = {r, 2 * p - 1 - r}, done[2] = {0, 0}, head = 0, tail = 0;
    for (int t = 0; t < T || head < tail; t++) {
      int who = t < T ? g->at[(size_t)r * (size_t)T + (size_t)t] : -1, k = who / m;
      if (who >= 0) {
        zb_schedule_push_op(s, r, vb_op[k], stage[vb_chunk[k]], who % m);
        if (k == 2 || k == 3)
          fifo[tail++] = k == 2 ? 1 : 0;
      } else if (head < tail) {
        int ch = fifo[head++];
        zb_schedule_push_op(s, r, ZB_OP_W, stage[ch], done[ch]++);
      }
    }
  }
  free(delta);
  free(lf);
  free(mem);
  free(wait);
  free(fifo);
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

/* Keeps the best of order's candidates in *best: W placed anew by timing
 * (when timing; with fill_all also run into every gap) and order as it
 * is. */
static void vb_keep_order(zb_schedule **best, zb_plan_score *best_score, zb_schedule *order,
                          const zb_costs *c, bool timing, bool fill_all, bool large) {
  zb_plan_score sc;
  zb_schedule *timed = timing ? zb_plan_place_w(order, c, ZB_W_GAP, &sc) : NULL;
  /* W run into every gap competes too when asked: under uneven costs it
   * made V-Half 3-45% shorter on the paper's grid (the cautious policy
   * never beat the gap one there) */
  if (timing && fill_all)
    zb_plan_keep(best, best_score, zb_plan_place_w(order, c, ZB_W_FILL_ALL, NULL), NULL, c, ZB_OBJ_MAKESPAN);
  /* The squeezed order as it is, each W in the first free slot after its
   * B, is a candidate too: under uneven costs it often beats W placed by
   * timing (V-Half 7% shorter at p=16, m=128); at even costs it never
   * did, so large plans spare its simulation there. Compared, both are
   * simulated: the greedy's own figures are only an upper bound. */
  bool both = !timed || !large || !zb_plan_costs_even(c);
  zb_plan_keep(best, best_score, timed, both ? NULL : &sc, c, ZB_OBJ_MAKESPAN);
  if (both)
    zb_plan_keep(best, best_score, order, NULL, c, ZB_OBJ_MAKESPAN);
  else
    zb_schedule_free(order);
}

zb_schedule *zb_plan_v_block(int p, int m, int hop, const zb_costs *c, bool fill_all, int squeezes,
                             zb_plan_score *score) {
  zb_schedule *best = NULL;
  zb_plan_score best_score;
  /* the tightest spacings whose block fits the limit as laid out: the
   * squeeze keeps it within, and W placed by timing then decides; one on
   * large plans, where the second gained at most 0.2% in the grids */
  bool large = (double)p * m > 4096;
  int tries = large ? 1 : 2;
  /* the held squeeze never won on large plans at even costs */
  if (large && zb_plan_costs_even(c) && squeezes == ZB_VB_BOTH)
    squeezes = ZB_VB_WHOLE;
  for (int sum = 0; sum < 3 * VB_PERIOD && tries > 0; sum++)
    for (int h = 0; h <= sum && tries > 0; h++) {
      int g = sum - h;
      if (!vb_fits(p, hop, g, h))
        continue;
      bool fits = true;
      for (int hold = 0; hold < 2 && fits; hold++) {
        if (!(squeezes & (hold ? ZB_VB_HELD : ZB_VB_WHOLE)))
          continue;
        vb_grid grid;
        vb_layout(&grid, p, m, hop, g, h);
        if ((fits = vb_raw_fits(&grid, c))) {
          vb_squeeze(&grid, c, hold);
          /* held: its W lifted, the cool-down squeezed again; by timing
           * too on plans that are not large (it never won on large ones) */
          vb_keep_order(&best, &best_score, hold ? vb_lift_cooldown(&grid, c) : vb_emit(&grid), c,
                        !hold || !large, fill_all, large);
        }
        free(grid.slot);
        free(grid.at);
      }
      tries -= fits;
    }
  if (best && score)
    *score = best_score;
  return best;
}
