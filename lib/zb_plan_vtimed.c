/* ZB-V timed against the costs (zb_plan_internal.h; docs/schedules.md,
 * zb-v): the ZB-V shape, built pass by pass on a clock, as the Zero
 * Bubble authors' V generator does, so that under uneven costs each rank
 * waits as little as the V allows.
 *
 * Every pass is placed at the earliest time its inputs and its rank
 * allow. The warm-up starts every rank's first chunk, then, walking up
 * from rank p-1 to 0, lets ranks 0..r run more chunk-0 forwards while
 * rank r waits for its first chunk-1 input (as long as they end before it
 * comes and rank r keeps room for the 2r+2 activations still to arrive);
 * deeper ranks then catch up with their neighbours' forward counts. The
 * steady state goes in rounds: each rank runs one B (its chunk 1's first
 * for a microbatch; chunk 0's once the gradient from below is on its
 * way) and then one F, and fills the wait for an input with pending W
 * ops: every W that ends before the input arrives, and one more when the
 * wait would exceed the idle time it may still take. That allowance
 * evens the ranks' idle time out: a first run lets a rank idle up to the
 * most idle rank so far; each next run lets rank r also idle up to the
 * previous run's worst idle time minus its own then, and runs go on
 * while the worst falls. Whether
 * that extra W may also go before a chunk-1 B and before an F gives the
 * four variants.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_plan_internal.h"

#define VT_MAX_RUNS 16 /* of one variant's chain of allowances */

/* Where a pass waits for its input: in the warm-up (no extra W), before
 * a chunk-0 B (an extra W may always go), a chunk-1 B or an F (it may
 * in some variants). */
enum { VT_WARM, VT_B0, VT_B1, VT_F, VT_SITES };

typedef struct vt_rank {
  double t, mem, idle; /* free from; memory held; idle since its first pass */
  bool started;
  int f[2], b[2];   /* passes run per chunk (0: stage r, 1: stage 2p-1-r) */
  int *wq, wq_head; /* pending W as chunk + 2 mb, oldest first */
  int wq_n;
} vt_rank;

typedef struct vtimed {
  int p, m;
  const zb_costs *c;
  double limit;
  zb_schedule *s;
  vt_rank *rk;
  double *f_end, *b_end; /* per (stage, mb): end of its pass, NAN until placed */
  int *want;             /* per rank: scratch of a round */
  const double *allow;   /* per rank: the previous run's idle time, NULL on the first */
  double allow_max;
  double idle_max;         /* the largest rank idle time so far */
  bool extra_at[VT_SITES]; /* where the one more W may go (vt_fill) */
  bool wanted[VT_SITES];   /* where it would have gone, allowed or not */
  bool stuck;              /* a pass the plan needs cannot be placed: the run is dropped */
} vtimed;

static int vt_stage(const vtimed *x, int r, int chunk) {
  return chunk ? 2 * x->p - 1 - r : r;
}

static size_t vt_at(const vtimed *x, int stage, int mb) {
  return (size_t)stage * (size_t)x->m + (size_t)mb;
}

/* When the input of rank r's next op (F or B) of chunk arrives: its
 * producer's end, plus a transfer when that is on another rank (a B also
 * waits for its own F); 0 with no producer, NAN while one is not placed.
 * *far: whether it comes from another rank (only then may a W fill the
 * wait). */
static double vt_input(const vtimed *x, int r, zb_op op, int chunk, bool *far) {
  const vt_rank *k = &x->rk[r];
  int st = vt_stage(x, r, chunk);
  int mb = op == ZB_OP_F ? k->f[chunk] : k->b[chunk];
  double own = 0;
  if (op == ZB_OP_B)
    own = k->f[chunk] > mb ? x->f_end[vt_at(x, st, mb)] : NAN;
  int from = op == ZB_OP_F ? st - 1 : st + 1;
  *far = false;
  if (from < 0 || from >= 2 * x->p || isnan(own))
    return own;
  double end = (op == ZB_OP_F ? x->f_end : x->b_end)[vt_at(x, from, mb)];
  *far = zb_placement_rank(ZB_PLACE_V, x->p, 2, from) != r;
  end += *far ? x->c->t_comm : 0; /* stays NAN while unplaced */
  return end > own ? end : isnan(end) ? NAN : own;
}

static bool vt_placed(double at) {
  return !isnan(at);
}

static void vt_put(vtimed *x, int r, zb_op op, int chunk) {
  vt_rank *k = &x->rk[r];
  int st = vt_stage(x, r, chunk);
  int *n = op == ZB_OP_F ? &k->f[chunk] : &k->b[chunk];
  int mb = *n;
  double dur = op == ZB_OP_F ? x->c->t_f[st] : x->c->t_b[st];
  double dm = op == ZB_OP_F ? x->c->m_f[st] : x->c->m_b[st];
  bool far;
  double in = vt_input(x, r, op, chunk, &far);
  double start = fmax(k->t, vt_placed(in) ? in : 0);
  if (k->started) {
    k->idle += start - k->t;
    x->idle_max = fmax(x->idle_max, k->idle);
  }
  k->started = true;
  k->t = start + dur;
  k->mem += dm;
  (op == ZB_OP_F ? x->f_end : x->b_end)[vt_at(x, st, mb)] = k->t;
  zb_schedule_push_op(x->s, r, op, st, mb);
  (*n)++;
  if (op == ZB_OP_B)
    k->wq[k->wq_head + k->wq_n++] = chunk + 2 * mb;
}

static bool vt_put_w(vtimed *x, int r) {
  vt_rank *k = &x->rk[r];
  if (!k->wq_n)
    return false;
  int w = k->wq[k->wq_head++];
  k->wq_n--;
  int st = vt_stage(x, r, w & 1);
  k->t += x->c->t_w[st];
  k->mem += x->c->m_w[st];
  zb_schedule_push_op(x->s, r, ZB_OP_W, st, w >> 1);
  return true;
}

/* How much longer rank r may idle: up to the most idle rank's idle time
 * so far, or, after a first run and when more, up to that run's worst
 * less rank r's own idle time in it. */
static double vt_may_idle(const vtimed *x, int r) {
  double worst = x->idle_max;
  if (x->allow)
    worst = fmax(worst, x->allow_max - x->allow[r]);
  return worst - x->rk[r].idle;
}

/* Fills rank r's wait, at site, for an input arriving at `in` with
 * pending W ops (module comment). */
static void vt_fill(vtimed *x, int r, double in, bool far, int site) {
  vt_rank *k = &x->rk[r];
  if (!far || !vt_placed(in))
    return;
  while (k->wq_n && in >= k->t + x->c->t_w[vt_stage(x, r, k->wq[k->wq_head] & 1)])
    vt_put_w(x, r);
  if (site != VT_WARM && k->wq_n && in - k->t > vt_may_idle(x, r)) {
    x->wanted[site] = true;
    if (x->extra_at[site])
      vt_put_w(x, r);
  }
}

/* Places rank r's next op of chunk, filling the wait for its input
 * first (at site, as vt_fill), when its input is placed: false, and
 * nothing changes, when it is not. W ops make room for an F the memory
 * limit holds back; with none left the run is stuck, or in the warm-up
 * the F waits for the steady state (false). */
static bool vt_try(vtimed *x, int r, zb_op op, int chunk, int site) {
  vt_rank *k = &x->rk[r];
  bool far;
  double in = vt_input(x, r, op, chunk, &far);
  int st = vt_stage(x, r, chunk);
  if ((op == ZB_OP_F ? k->f[chunk] : k->b[chunk]) >= x->m || !vt_placed(in))
    return false;
  double dm = op == ZB_OP_F ? x->c->m_f[st] : x->c->m_b[st];
  if (site == VT_WARM && k->mem + dm > x->limit + 1e-9)
    return false;
  while (k->mem + dm > x->limit + 1e-9)
    if (!vt_put_w(x, r)) {
      x->stuck = true;
      return false;
    }
  vt_fill(x, r, in, far, site);
  vt_put(x, r, op, chunk);
  return true;
}

/* Rank r's forwards until its first chunk-1 input: rank r-1 and above
 * ran theirs; ranks 0..r run waves of chunk-0 forwards meanwhile. */
static void vt_warm_rank(vtimed *x, int r) {
  vt_rank *k = &x->rk[r];
  if (r < x->p - 1) {
    double in = x->f_end[vt_at(x, vt_stage(x, r + 1, 1), 0)] + x->c->t_comm;
    double keep = x->c->m_f[r] * (2 + 2 * r); /* activations still to come to rank r */
    while (!x->stuck && k->f[0] < x->m && k->mem + keep <= x->limit + 1e-9 && k->t + x->c->t_f[r] <= in) {
      bool moved = false;
      for (int j = 0; j <= r; j++)
        moved |= x->rk[j].f[0] < x->m && vt_try(x, j, ZB_OP_F, 0, VT_WARM);
      x->stuck |= !moved;
    }
  }
  if (!vt_try(x, r, ZB_OP_F, 1, VT_WARM))
    x->stuck = true;
}

static int vt_forwards(const vt_rank *k) {
  return k->f[0] + k->f[1];
}

/* The warm-up (module comment): every rank's first forward; the waves
 * while each rank waits for its first chunk-1 input; deeper ranks catch
 * up with the forward counts of the rank above them, running the two
 * chunks' forwards in turns from rank p-1 up, as far as their memory
 * lets them (the rest is the steady state's). */
static void vt_warm_up(vtimed *x) {
  int p = x->p, m = x->m, turn = 0;
  for (int r = 0; r < p && !x->stuck; r++)
    x->stuck |= !vt_try(x, r, ZB_OP_F, 0, VT_WARM);
  for (int r = p - 1; r >= 0 && !x->stuck; r--)
    vt_warm_rank(x, r);
  for (int r = 1; r < p && !x->stuck; r++) {
    const vt_rank *k = &x->rk[r], *up = &x->rk[r - 1];
    int still = 0; /* passes in a row that placed nothing */
    while (!x->stuck && (vt_forwards(k) < vt_forwards(up) || (k->f[1] <= up->f[1] && up->f[1] < m))) {
      bool moved = false;
      for (int j = p - 1; j >= r; j--)
        moved |= x->rk[j].f[turn] < m && vt_try(x, j, ZB_OP_F, turn, VT_WARM);
      turn ^= 1;
      still = moved ? 0 : still + 1;
      if (still == 2)
        break;
    }
  }
}

/* The chunk of rank r's next B: chunk 1's first for a microbatch, then
 * chunk 0's once the gradient it needs is placed (rank p-1 makes its
 * own); -1 when r has run every B. */
static int vt_next_b(const vtimed *x, int r) {
  const vt_rank *k = &x->rk[r];
  if (k->b[0] >= x->m)
    return -1;
  if (k->b[0] >= k->b[1])
    return 1;
  if (r == x->p - 1 || k->b[1] >= x->m)
    return 0;
  return vt_placed(x->b_end[vt_at(x, vt_stage(x, r + 1, 0), k->b[0])]) ? 0 : 1;
}

/* The chunk of rank r's next F: chunk 1's when its input is placed,
 * else chunk 0's when its input is; -1 for none. */
static int vt_next_f(const vtimed *x, int r) {
  const vt_rank *k = &x->rk[r];
  int p = x->p, m = x->m;
  if (k->f[1] >= m)
    return -1;
  if (k->f[1] >= k->f[0])
    return 0;
  if (r == p - 1 || vt_placed(x->f_end[vt_at(x, vt_stage(x, r + 1, 1), k->f[1])]))
    return 1;
  if (k->f[0] < m && (r == 0 || vt_placed(x->f_end[vt_at(x, r - 1, k->f[0])])))
    return 0;
  return -1;
}

/* One round of the steady state: a B on every rank that has one ready
 * (chunk 0's from rank p-1 up, as their gradient flows, then chunk 1's
 * from rank 0 down), then an F on every rank that has one. Whether it
 * placed anything. */
static bool vt_round(vtimed *x) {
  int p = x->p;
  bool moved = false;
  int *want = x->want;
  for (int r = 0; r < p; r++)
    want[r] = vt_next_b(x, r);
  for (int r = p - 1; r >= 0 && !x->stuck; r--)
    moved |= want[r] == 0 && vt_try(x, r, ZB_OP_B, 0, VT_B0);
  for (int r = 0; r < p && !x->stuck; r++)
    moved |= want[r] == 1 && vt_try(x, r, ZB_OP_B, 1, VT_B1);
  for (int r = 0; r < p && !x->stuck; r++) {
    int chunk = vt_next_f(x, r);
    moved |= chunk >= 0 && vt_try(x, r, ZB_OP_F, chunk, VT_F);
  }
  return moved;
}

static bool vt_done(const vtimed *x) {
  for (int r = 0; r < x->p; r++)
    if (x->rk[r].b[0] < x->m)
      return false;
  return true;
}

/* One run of variant under the allowance `allow` (NULL: none yet); each
 * rank's idle time into idle, and where an extra W was wanted into
 * wanted (or-ed in). NULL when it gets stuck. */
static zb_schedule *vt_build(int p, int m, const zb_costs *c, int variant, const double *allow,
                             double allow_max, double *idle, bool *wanted) {
  size_t cells = (size_t)2 * (size_t)p * (size_t)m;
  vtimed x = {.p = p,
              .m = m,
              .c = c,
              .limit = c->mem_limit > 0 ? c->mem_limit : INFINITY,
              .s = zb_schedule_new_room(p, 2, m, ZB_PLACE_V, 6),
              .rk = zb_calloc((size_t)p, sizeof(vt_rank)),
              .f_end = zb_malloc(sizeof(double) * cells),
              .b_end = zb_malloc(sizeof(double) * cells),
              .want = zb_malloc(sizeof(int) * (size_t)p),
              .allow = allow,
              .allow_max = allow_max,
              .extra_at = {[VT_B0] = true, [VT_B1] = variant & 1, [VT_F] = variant & 2}};
  for (size_t i = 0; i < cells; i++)
    x.f_end[i] = x.b_end[i] = NAN;
  for (int r = 0; r < p; r++)
    x.rk[r].wq = zb_malloc(sizeof(int) * 2 * (size_t)m);
  vt_warm_up(&x);
  while (!x.stuck && !vt_done(&x))
    x.stuck = !vt_round(&x) || x.stuck;
  for (int r = 0; r < p; r++) {
    while (vt_put_w(&x, r)) {
    }
    idle[r] = x.rk[r].idle;
    free(x.rk[r].wq);
  }
  free(x.rk);
  free(x.f_end);
  free(x.b_end);
  free(x.want);
  for (int k = 0; k < VT_SITES; k++)
    wanted[k] |= x.wanted[k];
  if (x.stuck) {
    zb_schedule_free(x.s);
    return NULL;
  }
  return x.s;
}

/* A variant's chain of runs (module comment): the one whose worst idle
 * time is least. */
static zb_schedule *vt_chain(int p, int m, const zb_costs *c, int variant, bool *wanted) {
  zb_schedule *best = NULL;
  double best_worst = INFINITY, allow_max = 0;
  double *idle = zb_malloc(sizeof(double) * (size_t)p), *allow = NULL;
  for (int run = 0; run < VT_MAX_RUNS; run++) {
    zb_schedule *s = vt_build(p, m, c, variant, allow, allow_max, idle, wanted);
    double worst = 0;
    for (int r = 0; r < p; r++)
      worst = fmax(worst, idle[r]);
    if (!s || worst >= best_worst - 1e-9) {
      zb_schedule_free(s);
      break;
    }
    zb_schedule_free(best);
    best = s;
    best_worst = allow_max = worst;
    if (!allow)
      allow = zb_malloc(sizeof(double) * (size_t)p);
    memcpy(allow, idle, sizeof(double) * (size_t)p);
  }
  free(idle);
  free(allow);
  return best;
}

int zb_plan_v_timed(int p, int m, const zb_costs *c, zb_schedule **out) {
  enum { ALL = ZB_VT_VARIANTS - 1 }; /* extra W before a chunk-1 B (bit 0) and an F (bit 1) */
  bool wanted[VT_SITES] = {false}, scratch[VT_SITES] = {false}; /* scratch: what later chains want */
  int n = 0;
  if ((out[n] = vt_chain(p, m, c, ALL, wanted)))
    n++;
  /* a variant that forbids an extra W where ALL never wanted one runs
   * as ALL did, pass for pass: left out */
  for (int variant = ALL - 1; variant >= 0; variant--) {
    bool differs = (!(variant & 1) && wanted[VT_B1]) || (!(variant & 2) && wanted[VT_F]);
    if (differs && (out[n] = vt_chain(p, m, c, variant, scratch)))
      n++;
  }
  return n;
}
