/* The greedy list scheduler shared by zb-auto and the V family.
 *
 * It follows the paper's heuristic (section 3): ranks decide in global
 * time order; a rank runs a ready B first (critical path), else a ready F
 * while its stage's warm-up cap and the memory limit allow, else a pending
 * W when the gap until its next input is at least T_W (or, with
 * fill_small_gaps, any gap; with even_idle, a shorter gap too when idling
 * through it would leave the rank the most idle of all so far), else it
 * idles until that input arrives.
 */
#include <math.h>
#include <stdlib.h>

#include "zb_alloc.h"
#include "zb_plan_internal.h"

#define ZB_EPS 1e-9

/* ---- the ranks by their next decision time: a tournament tree ----
 * Leaf size + r holds rank r (-1 once it has finished); each inner node
 * the better of its two children by (key, rank). A key change replays
 * the rank's path to the root: log2(p) comparisons and no moves, about a
 * fifth of what a binary heap's sift took (the greedy's hottest loop). */
typedef struct rank_heap {
  int n;    /* ranks still in */
  int size; /* leaves: the power of two at or above p */
  int *tree;
  const double *key;
} rank_heap;

static inline int tree_better(const rank_heap *h, int a, int b) {
  if (a < 0 || b < 0)
    return a < 0 ? b : a;
  double ka = h->key[a], kb = h->key[b];
  return ka < kb || (ka == kb && a < b) ? a : b;
}

static void tree_replay(rank_heap *h, int rank) {
  for (int i = (h->size + rank) >> 1; i >= 1; i >>= 1)
    h->tree[i] = tree_better(h, h->tree[2 * i], h->tree[2 * i + 1]);
}

/* The rank deciding next; -1 when none is left. */
static inline int heap_top(const rank_heap *h) {
  return h->tree[1];
}

static void heap_remove(rank_heap *h, int rank) {
  if (h->tree[h->size + rank] < 0)
    return;
  h->tree[h->size + rank] = -1;
  h->n--;
  tree_replay(h, rank);
}

/* Re-sorts after rank's key changed (in either direction). */
static void heap_update(rank_heap *h, int rank) {
  if (h->tree[h->size + rank] < 0) {
    h->tree[h->size + rank] = rank;
    h->n++;
  }
  tree_replay(h, rank);
}

/* ---- the greedy ---- */
typedef struct greedy {
  int p, v, m, S;
  zb_placement pl;
  const zb_costs *c;
  const int *cap;
  bool fill_small_gaps;
  bool cautious;         /* estimate unknown inputs instead of assuming they are far */
  bool even_idle;        /* ZB_W_EVEN_IDLE */
  double worst_idle;     /* the most idle time any rank has had since its first op */
  int *stage_rank;       /* S */
  int **rank_stages;     /* p x v, deepest stage first */
  int *nf, *nb, *nw;     /* per stage: ops done (in microbatch order) */
  double *f_end, *b_end; /* S x m */
  double *e;             /* per rank: free time */
  double *d;             /* per rank: next decision time (INFINITY: blocked) */
  double *mem;
  double *first;             /* per rank: start of its first op (NAN: none yet) */
  double *idle;              /* per rank: idle time since its first op */
  int *left;                 /* per rank: ops left */
  bool *waited_guess;        /* per rank: idled once on a cautious estimate since its last op */
  const zb_schedule *follow; /* NULL, or the F and B order each rank keeps */
  int *next_fb;              /* with follow: per rank, the index of its next F or B there */
} greedy;

static double greedy_arrival(const greedy *g, double produced, int from_stage, int to_rank) {
  return g->stage_rank[from_stage] == to_rank ? produced : produced + g->c->t_comm;
}

/* Ready time of the next F of stage s on its rank; NAN if not produced. */
static double greedy_f_ready(const greedy *g, int s) {
  int i = g->nf[s];
  if (i >= g->m)
    return NAN;
  if (s == 0)
    return 0;
  double t = g->f_end[(size_t)(s - 1) * g->m + i];
  return isnan(t) ? t : greedy_arrival(g, t, s - 1, g->stage_rank[s]);
}

static double greedy_b_ready(const greedy *g, int s) {
  int i = g->nb[s];
  if (i >= g->nf[s])
    return NAN;
  double own = g->f_end[(size_t)s * g->m + i];
  if (s == g->S - 1)
    return own;
  double t = g->b_end[(size_t)(s + 1) * g->m + i];
  if (isnan(t))
    return t;
  t = greedy_arrival(g, t, s + 1, g->stage_rank[s]);
  return t > own ? t : own;
}

/* What B will add to memory on stage s (M_B > 0: B keeps more than it
 * frees, docs/schedules.md, Cost and memory model), else 0. */
static double greedy_b_growth(const greedy *g, int s) {
  return g->c->m_b[s] > 0 ? g->c->m_b[s] : 0;
}

/* An F is admitted only when the rank's memory, the growth every pending
 * B of the rank will bring, and this microbatch's F and B fit: so a B,
 * which the greedy never holds back, cannot break the limit. With M_B <= 0
 * this is the plain test of mem + M_F. */
static bool greedy_f_allowed(const greedy *g, int s) {
  int r = g->stage_rank[s];
  if (g->nf[s] >= g->m)
    return false;
  if (g->cap[s] > 0 && g->nf[s] - g->nb[s] >= g->cap[s])
    return false;
  double lim = g->c->mem_limit;
  if (lim <= 0)
    return true;
  double need = g->mem[r] + g->c->m_f[s] + greedy_b_growth(g, s);
  for (int q = 0; q < g->S; q++)
    if (g->stage_rank[q] == r)
      need += (g->nf[q] - g->nb[q]) * greedy_b_growth(g, q);
  return need <= lim + ZB_EPS * (1 + fabs(lim));
}

static void greedy_wake(greedy *g, rank_heap *h, int rank, double arrival) {
  if (g->left[rank] == 0)
    return;
  double t = arrival > g->e[rank] ? arrival : g->e[rank];
  if (t < g->d[rank]) {
    g->d[rank] = t;
    heap_update(h, rank);
  }
}

/* Runs op on rank r at time `at` and records it in the schedule. */
static void greedy_run(greedy *g, rank_heap *h, zb_schedule *out, int r, zb_op op, int s, double at) {
  int mb = op == ZB_OP_F ? g->nf[s]++ : op == ZB_OP_B ? g->nb[s]++ : g->nw[s]++;
  double end = at + zb_costs_time(g->c, op, s);
  if (isnan(g->first[r]))
    g->first[r] = at;
  else if (at > g->e[r]) {
    g->idle[r] += at - g->e[r];
    g->worst_idle = g->idle[r] > g->worst_idle ? g->idle[r] : g->worst_idle;
  }
  g->mem[r] += zb_costs_mem(g->c, op, s);
  g->e[r] = end;
  g->d[r] = end;
  g->left[r]--;
  g->waited_guess[r] = false;
  zb_schedule_push_op(out, r, op, s, mb);
  if (op == ZB_OP_F) {
    g->f_end[(size_t)s * g->m + mb] = end;
    if (s + 1 < g->S)
      greedy_wake(g, h, g->stage_rank[s + 1], greedy_arrival(g, end, s, g->stage_rank[s + 1]));
    else
      greedy_wake(g, h, r, end);
  } else if (op == ZB_OP_B) {
    g->b_end[(size_t)s * g->m + mb] = end;
    if (s > 0)
      greedy_wake(g, h, g->stage_rank[s - 1], greedy_arrival(g, end, s, g->stage_rank[s - 1]));
  }
  if (g->left[r] == 0)
    heap_remove(h, r);
  else
    heap_update(h, r);
}

/* What a rank's decision at time t learns about its stages besides the op
 * it may run: the earliest known input after t, the earliest estimated
 * arrival of an unproduced B input (cautious policy only), and a ready F
 * that only the memory limit holds back. */
typedef struct greedy_look {
  double t;
  double next;  /* INFINITY: none known */
  double guess; /* INFINITY: none */
  int want_f;   /* stage, -1: none */
} greedy_look;

/* Cautious estimate for stage s's next B whose input is not produced yet:
 * its producer cannot finish before it is next free plus the op itself; a
 * W longer than that would delay it. */
static void greedy_guess_b_input(const greedy *g, int r, int s, greedy_look *look) {
  int q = g->stage_rank[s + 1];
  double est = (g->d[q] > g->e[q] ? g->d[q] : g->e[q]);
  if (isinf(est))
    est = g->e[q];
  est += g->c->t_b[s + 1] + (q != r ? g->c->t_comm : 0);
  if (est > look->t && est < look->guess)
    look->guess = est;
}

/* The stage of rank r's ready B with the earliest input (critical path
 * first); -1 if none is ready at look->t. */
static int greedy_pick_b(const greedy *g, int r, greedy_look *look) {
  int best_b = -1;
  double best_b_ready = INFINITY;
  for (int k = 0; k < g->v; k++) {
    int s = g->rank_stages[r][k];
    double rb = greedy_b_ready(g, s);
    if (isnan(rb) && g->cautious && g->nb[s] < g->nf[s] && s + 1 < g->S)
      greedy_guess_b_input(g, r, s, look);
    if (!isnan(rb)) {
      if (rb <= look->t + ZB_EPS && rb < best_b_ready) {
        best_b = s;
        best_b_ready = rb;
      } else if (rb > look->t && rb < look->next) {
        look->next = rb;
      }
    }
  }
  return best_b;
}

/* The stage of rank r's ready F that its warm-up cap and the memory limit
 * allow, deepest stage first; -1 if none. */
static int greedy_pick_f(const greedy *g, int r, greedy_look *look) {
  for (int k = 0; k < g->v; k++) {
    int s = g->rank_stages[r][k];
    double rf = greedy_f_ready(g, s);
    if (isnan(rf) || g->nf[s] >= g->m)
      continue;
    if (g->cap[s] > 0 && g->nf[s] - g->nb[s] >= g->cap[s])
      continue;
    if (!greedy_f_allowed(g, s)) {
      if (rf <= look->t + ZB_EPS && look->want_f < 0)
        look->want_f = s; /* blocked by memory only: a W would help */
      continue;
    }
    if (rf <= look->t + ZB_EPS)
      return s;
    if (rf < look->next)
      look->next = rf;
  }
  return -1;
}

/* With a followed order: rank r's next F or B there, if it is ready at
 * look->t (an F also within the memory limit); its stage, with *op; else
 * -1, noting when it will be ready or that memory holds it back. */
static int greedy_pick_follow(greedy *g, int r, greedy_look *look, zb_op *op) {
  const zb_rank_list *l = &g->follow->ranks[r];
  int *i = &g->next_fb[r];
  /* ranks take turns by time, too many streams for the hardware
   * prefetcher: at p = 256 waiting for this list was most of a run */
  if (*i + 16 < l->n)
    __builtin_prefetch(&l->actions[*i + 16]);
  while (*i < l->n && l->actions[*i].op != ZB_OP_F && l->actions[*i].op != ZB_OP_B)
    (*i)++;
  if (*i >= l->n)
    return -1;
  const zb_action *a = &l->actions[*i];
  int s = a->stage;
  bool is_f = a->op == ZB_OP_F;
  if ((is_f ? g->nf[s] : g->nb[s]) != a->mb)
    return -1; /* a list whose stage runs microbatches out of order: not followed */
  double ready = is_f ? greedy_f_ready(g, s) : greedy_b_ready(g, s);
  if (isnan(ready)) {
    if (!is_f && g->cautious && s + 1 < g->S)
      greedy_guess_b_input(g, r, s, look);
    return -1;
  }
  if (ready > look->t + ZB_EPS) {
    look->next = ready;
    return -1;
  }
  if (is_f && !greedy_f_allowed(g, s)) {
    look->want_f = s;
    return -1;
  }
  (*i)++;
  *op = a->op;
  return s;
}

/* The stage of rank r with the most pending W (the first such stage in
 * rank_stages order); -1 if none. Its oldest W runs next. */
static int greedy_pick_w(const greedy *g, int r) {
  int w_stage = -1, w_pending = 0;
  for (int k = 0; k < g->v; k++) {
    int s = g->rank_stages[r][k];
    int pend = g->nb[s] - g->nw[s];
    if (pend > w_pending) {
      w_pending = pend;
      w_stage = s;
    }
  }
  return w_stage;
}

/* One decision of rank r at time t = d[r]: runs an op, or moves d[r] on to
 * when new input can arrive (INFINITY: blocked until a neighbour wakes it). */
static void greedy_step(greedy *g, rank_heap *h, zb_schedule *out, int r) {
  greedy_look look = {.t = g->d[r], .next = INFINITY, .guess = INFINITY, .want_f = -1};
  double t = look.t;
  if (g->follow) {
    zb_op op;
    int s = greedy_pick_follow(g, r, &look, &op);
    if (s >= 0) {
      greedy_run(g, h, out, r, op, s, t);
      return;
    }
  } else {
    int s = greedy_pick_b(g, r, &look);
    if (s >= 0) {
      greedy_run(g, h, out, r, ZB_OP_B, s, t);
      return;
    }
    s = greedy_pick_f(g, r, &look);
    if (s >= 0) {
      greedy_run(g, h, out, r, ZB_OP_F, s, t);
      return;
    }
  }
  int w_stage = greedy_pick_w(g, r);
  /* An estimate is only a guess: a rank waits on one at most once between
   * two of its ops, so two ranks guessing at each other cannot spin. */
  bool use_guess = look.guess < look.next && !g->waited_guess[r];
  double gap_end = use_guess ? look.guess : look.next;
  double next = look.next;
  if (w_stage >= 0) {
    double tw = g->c->t_w[w_stage];
    /* even_idle: a rank that would idle through the gap to more than any
     * rank so far (its span the longest, by what it has run) runs the W */
    bool most_idle =
        g->even_idle && !isnan(g->first[r]) && g->idle[r] + (gap_end - t) > g->worst_idle + ZB_EPS;
    if (look.want_f >= 0 || isinf(gap_end) || gap_end - t >= tw - ZB_EPS || g->fill_small_gaps || most_idle) {
      greedy_run(g, h, out, r, ZB_OP_W, w_stage, t);
      return;
    }
    if (use_guess) {
      g->waited_guess[r] = true;
      next = look.guess;
    }
  }
  /* idle until the next known input, or block until a neighbour wakes us */
  g->d[r] = next;
  heap_update(h, r);
}

/* Where each stage runs: stage_rank[s], and per rank its stages deepest
 * first (rank_stages). */
static void greedy_place_stages(greedy *g) {
  int *fill = zb_calloc((size_t)g->p, sizeof(int));
  g->stage_rank = zb_malloc(sizeof(int) * (size_t)g->S);
  g->rank_stages = zb_malloc(sizeof(int *) * (size_t)g->p);
  for (int r = 0; r < g->p; r++)
    g->rank_stages[r] = zb_malloc(sizeof(int) * (size_t)g->v);
  for (int s = g->S - 1; s >= 0; s--) {
    int r = zb_placement_rank(g->pl, g->p, g->v, s);
    g->stage_rank[s] = r;
    g->rank_stages[r][fill[r]++] = s;
  }
  free(fill);
}

/* Allocates the per-stage and per-rank state: nothing run yet. */
static void greedy_init(greedy *g) {
  size_t S = (size_t)g->S, p = (size_t)g->p, cells = S * (size_t)g->m;
  greedy_place_stages(g);
  g->nf = zb_calloc(S, sizeof(int));
  g->nb = zb_calloc(S, sizeof(int));
  g->nw = zb_calloc(S, sizeof(int));
  g->f_end = zb_malloc(sizeof(double) * cells);
  g->b_end = zb_malloc(sizeof(double) * cells);
  for (size_t k = 0; k < cells; k++)
    g->f_end[k] = g->b_end[k] = NAN;
  g->e = zb_calloc(p, sizeof(double));
  g->d = zb_calloc(p, sizeof(double));
  g->mem = zb_calloc(p, sizeof(double));
  g->first = zb_malloc(sizeof(double) * p);
  g->idle = zb_calloc(p, sizeof(double));
  g->left = zb_calloc(p, sizeof(int));
  g->waited_guess = zb_calloc(p, sizeof(bool));
  for (int r = 0; r < g->p; r++) {
    g->first[r] = NAN;
    g->left[r] = 3 * g->v * g->m;
  }
}

static void greedy_free(greedy *g) {
  for (int r = 0; r < g->p; r++)
    free(g->rank_stages[r]);
  free(g->rank_stages);
  free(g->stage_rank);
  free(g->nf);
  free(g->nb);
  free(g->nw);
  free(g->f_end);
  free(g->b_end);
  free(g->e);
  free(g->d);
  free(g->mem);
  free(g->first);
  free(g->idle);
  free(g->left);
  free(g->waited_guess);
  free(g->next_fb);
}

/* The tree of all ranks by decision time: the rank of stage 0 decides at
 * 0, every other one waits for input. */
static void greedy_heap_init(greedy *g, rank_heap *h) {
  int size = 1;
  while (size < g->p)
    size *= 2;
  *h = (rank_heap){.size = size, .tree = zb_malloc(sizeof(int) * 2 * (size_t)size), .key = g->d};
  for (int i = 0; i < 2 * size; i++)
    h->tree[i] = -1;
  for (int r = 0; r < g->p; r++)
    g->d[r] = r == g->stage_rank[0] ? 0 : INFINITY;
  for (int r = 0; r < g->p; r++)
    heap_update(h, r);
}

/* The figures of the greedy's own run. zb_simulate runs the same lists as
 * early as each op can go, which the greedy's idling does not always do
 * (V-Min's W placement at p=32, m=256, uneven costs: 1067.6 here, 1067.3
 * simulated): an upper bound, and usually exact. */
static void greedy_score(const greedy *g, zb_objective obj, zb_plan_score *score) {
  score->objective = obj;
  score->makespan = score->span = 0;
  for (int r = 0; r < g->p; r++) {
    if (isnan(g->first[r]))
      continue;
    if (g->e[r] > score->makespan)
      score->makespan = g->e[r];
    if (g->e[r] - g->first[r] > score->span)
      score->span = g->e[r] - g->first[r];
  }
}

/* Runs the greedy to its end; the lists, or NULL when it got stuck. */
static zb_schedule *greedy_go(greedy *g, int w_policy, zb_objective obj, zb_plan_score *score) {
  g->fill_small_gaps = w_policy == ZB_W_FILL_ALL;
  g->cautious = w_policy == ZB_W_CAUTIOUS;
  g->even_idle = w_policy == ZB_W_EVEN_IDLE;
  greedy_init(g);
  rank_heap h;
  greedy_heap_init(g, &h);
  zb_schedule *out = zb_schedule_new(g->p, g->v, g->m, g->pl);
  zb_schedule_reserve_all(out, g->left);
  while (h.n > 0) {
    int r = heap_top(&h);
    if (isinf(g->d[r])) { /* every remaining rank waits on another: stuck */
      zb_schedule_free(out);
      out = NULL;
      break;
    }
    greedy_step(g, &h, out, r);
  }
  if (out && score)
    greedy_score(g, obj, score);
  greedy_free(g);
  free(h.tree);
  return out;
}

zb_schedule *zb_plan_greedy(int p, int v, int m, zb_placement pl, const zb_costs *c, const int *cap,
                            int w_policy, zb_objective obj, zb_plan_score *score) {
  greedy g = {.p = p, .v = v, .m = m, .S = p * v, .pl = pl, .c = c, .cap = cap};
  return greedy_go(&g, w_policy, obj, score);
}

zb_schedule *zb_plan_place_w(const zb_schedule *order, const zb_costs *c, int w_policy,
                             zb_plan_score *score) {
  int *cap = zb_calloc((size_t)(order->p * order->v), sizeof(int));
  greedy g = {.p = order->p,
              .v = order->v,
              .m = order->m,
              .S = order->p * order->v,
              .pl = order->placement,
              .c = c,
              .cap = cap,
              .follow = order,
              .next_fb = zb_calloc((size_t)order->p, sizeof(int))};
  zb_schedule *out = greedy_go(&g, w_policy, ZB_OBJ_MAKESPAN, score);
  free(cap);
  return out;
}
