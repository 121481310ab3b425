/* zb_period.c — see zb_period.h. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_period.h"

/* Periods a stretch must span to count as the steady state, not a
 * coincidence of the warm-up: three of one or two microbatches, two of
 * more (a round of p microbatches on every chunk of a rank is a long
 * pattern to repeat by chance). */
#define PERIOD_MIN_PERIODS 3
static int period_min(int q) {
  return q > 2 ? 2 : PERIOD_MIN_PERIODS;
}

/* Whether y is x again, q microbatches on. */
static bool period_repeats(const zb_action *x, const zb_action *y, int q) {
  return y->op == x->op && y->stage == x->stage && y->mb == x->mb + q && y->peer == x->peer &&
         y->batch == x->batch && y->overlap == x->overlap;
}

/* Kinds of action a rank's period may hold, (op, stage) pairs: a
 * generator's rank holds a few per chunk; more, and it has no period. */
#define PERIOD_MAX_KINDS 64

/* Where (op, stage) of a sits in kinds[0..*n), added when new; -1 when
 * the table is full. */
static int period_kind(int (*kinds)[2], int *n, const zb_action *a) {
  for (int k = 0; k < *n; k++)
    if (kinds[k][0] == a->op && kinds[k][1] == a->stage)
      return k;
  if (*n == PERIOD_MAX_KINDS)
    return -1;
  kinds[*n][0] = a->op;
  kinds[*n][1] = a->stage;
  return (*n)++;
}

/* Whether a period (L actions from a) can repeat without two copies of
 * one (op, stage, microbatch): the microbatches it holds of each (op,
 * stage) differ modulo q. seen: room for PERIOD_MAX_KINDS q flags. */
static bool period_distinct(const zb_action *a, int L, int q, unsigned char *seen) {
  int kinds[PERIOD_MAX_KINDS][2], n = 0;
  memset(seen, 0, (size_t)PERIOD_MAX_KINDS * (size_t)q);
  for (int i = 0; i < L; i++) {
    int k = period_kind(kinds, &n, &a[i]);
    if (k < 0 || a[i].mb < 0)
      return false;
    unsigned char *at = &seen[(size_t)k * (size_t)q + (size_t)(a[i].mb % q)];
    if (*at)
      return false;
    *at = 1;
  }
  return true;
}

/* The microbatches that every (op, stage) of the stretch a[0..len) (L
 * actions a period) holds in common: [*lo, *hi], empty when *lo > *hi. A
 * rank lists each (op, stage) in microbatch order, and every period holds
 * the same ones: their first and last are in the first and last period. */
static void period_common(const zb_action *a, int len, int L, int *lo, int *hi) {
  int kinds[PERIOD_MAX_KINDS][2], n = 0, first[PERIOD_MAX_KINDS], last[PERIOD_MAX_KINDS];
  for (int i = 0; i < len; i = i + 1 == L && len - L > L ? len - L : i + 1) {
    int known = n, k = period_kind(kinds, &n, &a[i]);
    if (k < 0) { /* more than a generator's ranks hold: no common range */
      *lo = 1, *hi = 0;
      return;
    }
    if (n > known)
      first[k] = a[i].mb;
    last[k] = a[i].mb;
  }
  for (int k = 0; k < n; k++) {
    *lo = first[k] > *lo ? first[k] : *lo;
    *hi = last[k] < *hi ? last[k] : *hi;
  }
}

/* A rank's periodic stretch: actions [first, last) of its list, each
 * followed L later by itself q microbatches on (up to the last period). */
typedef struct period_stretch {
  int L, first, last;
} period_stretch;

/* Rank list l's longest stretch for L actions a period into *st; false
 * when none spans period_min(q) periods, or its first period would
 * repeat a (op, stage, microbatch). [*lo, *hi] narrows to the
 * microbatches the stretch holds of every (op, stage). */
static bool period_stretch_of(const zb_rank_list *l, int L, int q, unsigned char *seen, int *lo, int *hi,
                              period_stretch *st) {
  int best_s = 0, best_len = -1, run_s = 0;
  for (int j = 0; j + L <= l->n; j++) {
    bool on = j + L < l->n && period_repeats(&l->actions[j], &l->actions[j + L], q);
    if (on)
      continue;
    if (j - run_s > best_len) /* the run [run_s, j) of repeating actions ended here */
      best_s = run_s, best_len = j - run_s;
    run_s = j + 1;
  }
  /* the repeating actions and their repeats span best_len + L actions */
  *st = (period_stretch){.L = L, .first = best_s, .last = best_s + best_len + L};
  if (best_len + L < period_min(q) * L || !period_distinct(&l->actions[best_s], L, q, seen))
    return false;
  period_common(&l->actions[best_s], best_len + L, L, lo, hi);
  return true;
}

/* Whether rank list l holds only compute and comm actions (markers carry
 * no microbatch to move on) and each (op, stage) comes in rising
 * microbatch order, which moving what follows a cut relies on. Inside the
 * stretch the period says both; its first and last periods are read with
 * what lies before and after it. */
static bool period_in_order(const zb_rank_list *l, const period_stretch *st) {
  int kinds[PERIOD_MAX_KINDS][2], n = 0, last[PERIOD_MAX_KINDS];
  for (int i = 0; i < l->n;
       i = i + 1 == st->first + st->L && st->last - st->L > i + 1 ? st->last - st->L : i + 1) {
    zb_op op = (zb_op)l->actions[i].op;
    if (!zb_op_is_compute(op) && !zb_op_is_comm(op))
      return false;
    int known = n, k = period_kind(kinds, &n, &l->actions[i]);
    if (k < 0 || (k < known && l->actions[i].mb <= last[k]))
      return false;
    last[k] = l->actions[i].mb;
  }
  return true;
}

/* Actions per period of each rank (st[r].L) when every list holds the
 * same number per microbatch; the largest, or 0 when a list does not. */
static int period_lengths(const zb_schedule *s, int q, period_stretch *st) {
  int most = 0;
  for (int r = 0; r < s->p; r++) {
    const zb_rank_list *l = &s->ranks[r];
    if (l->n == 0 || l->n % s->m != 0)
      return 0;
    st[r].L = l->n / s->m * q; /* q <= m (period_find): no overflow past n */
    most = st[r].L > most ? st[r].L : most;
  }
  return most;
}

/* Every rank's stretch into st (p of them); *common: how many microbatches
 * all of them hold of every (op, stage); false when a rank has none or
 * they hold none in common. Each rank's stretch alone may be a pattern of
 * the warm-up that a short run keeps up for a while (at p = 256, a run of
 * 300 microbatches of V-Half has such stretches, and prolonged they
 * deadlock); the steady state is where every rank repeats at once. */
static bool period_find(const zb_schedule *s, int q, period_stretch *st, int *common) {
  int most = q >= 1 && q <= s->m ? period_lengths(s, q, st) : 0;
  if (most == 0)
    return false;
  unsigned char *seen = zb_malloc((size_t)PERIOD_MAX_KINDS * (size_t)q);
  int lo = 0, hi = s->m - 1;
  bool ok = true;
  for (int r = 0; ok && r < s->p; r++)
    ok = period_stretch_of(&s->ranks[r], st[r].L, q, seen, &lo, &hi, &st[r]) &&
         period_in_order(&s->ranks[r], &st[r]);
  free(seen);
  *common = hi - lo + 1;
  return ok && lo <= hi;
}

/* Rank list l with k periods (k < 0: -k fewer) from `cut` on, the
 * actions after them moved k q microbatches, into rank r of out. */
static void period_rank(const zb_rank_list *l, int L, int q, int cut, int k, zb_schedule *out, int r) {
  int n = l->n + k * L, at = cut; /* out has the room (period_room) */
  zb_action *dst = out->ranks[r].actions;
  memcpy(dst, l->actions, sizeof *dst * (size_t)cut);
  const zb_action *period = &l->actions[cut - L];
  for (int rep = 1; rep <= k; rep++)
    for (int i = 0; i < L; i++) {
      dst[at] = period[i];
      dst[at++].mb += rep * q;
    }
  for (int i = cut + (k < 0 ? -k * L : 0); i < l->n; i++) {
    dst[at] = l->actions[i];
    dst[at++].mb += k * q;
  }
  out->ranks[r].n = n;
}

/* Room in out for every rank's list with k periods more (k < 0: fewer). */
static void period_room(const zb_schedule *s, const period_stretch *st, int k, zb_schedule *out) {
  int *n = zb_malloc(sizeof(int) * (size_t)s->p);
  for (int r = 0; r < s->p; r++)
    n[r] = s->ranks[r].n + k * st[r].L;
  zb_schedule_reserve_all(out, n);
  free(n);
}

/* Copying the lists, in shares of the ranks (each piece its own ranks'
 * lists of out): cut mid-stretch, after a whole period. */
typedef struct period_job {
  const zb_schedule *s;
  const period_stretch *st;
  int q, k, pieces;
  zb_schedule *out;
} period_job;

static void period_piece(void *arg, int piece) {
  const period_job *j = arg;
  int r0 = zb_par_share(j->s->p, piece, j->pieces), r1 = zb_par_share(j->s->p, piece + 1, j->pieces);
  for (int r = r0; r < r1; r++) {
    const period_stretch *st = &j->st[r];
    int cut = st->first + (st->last - st->first) / st->L / 2 * st->L;
    period_rank(&j->s->ranks[r], st->L, j->q, cut, j->k, j->out, r);
  }
}

zb_schedule *zb_period_extend_par(const zb_schedule *s, int m, int q, const zb_par *par) {
  if (q < 1 || m < s->m || (m - s->m) % q != 0)
    return NULL;
  period_stretch *st = zb_malloc(sizeof *st * (size_t)s->p);
  int common;
  zb_schedule *out = NULL;
  bool fits = true; /* every list's new length an int */
  for (int r = 0; r < s->p && fits; r++)
    fits = (long long)s->ranks[r].n / s->m * (m - s->m) + s->ranks[r].n <= INT_MAX;
  if (fits && period_find(s, q, st, &common)) {
    out = zb_schedule_new(s->p, s->v, m, s->placement);
    period_room(s, st, (m - s->m) / q, out);
    int pieces = zb_par_width(par) < s->p ? zb_par_width(par) : s->p;
    period_job job = {.s = s, .st = st, .q = q, .k = (m - s->m) / q, .pieces = pieces, .out = out};
    zb_par_run(par, period_piece, &job, pieces);
  }
  free(st);
  return out;
}

zb_schedule *zb_period_extend(const zb_schedule *s, int m, int q) {
  return zb_period_extend_par(s, m, q, NULL);
}

zb_schedule *zb_period_shrink(const zb_schedule *s, int q, int keep) {
  period_stretch *st = zb_malloc(sizeof *st * (size_t)s->p);
  int common, k = 0;
  if (keep >= PERIOD_MIN_PERIODS && period_find(s, q, st, &common)) {
    k = common / q - keep; /* the steady state all ranks share keeps `keep` periods */
    for (int r = 0; r < s->p; r++) {
      int periods = (st[r].last - st[r].first) / st[r].L;
      k = periods - keep < k ? periods - keep : k;
    }
  }
  zb_schedule *out = k > 0 ? zb_schedule_new(s->p, s->v, s->m - k * q, s->placement) : NULL;
  if (out)
    period_room(s, st, -k, out);
  for (int r = 0; out && r < s->p; r++) /* the periods after the stretch's first go */
    period_rank(&s->ranks[r], st[r].L, q, st[r].first + st[r].L, -k, out, r);
  free(st);
  return out;
}

bool zb_period_times_repeat(const zb_schedule *s, int q, double *const *start) {
  period_stretch *st = zb_malloc(sizeof *st * (size_t)s->p);
  int common;
  bool ok = period_find(s, q, st, &common);
  double step = NAN;
  /* the stretch's first period is where a rank comes out of its warm-up,
   * often still waiting longer than the steady state does: left out when
   * the stretch holds three periods, so that every rank's is compared */
  for (int r = 0; ok && r < s->p; r++)
    for (int i = st[r].first + (st[r].last - st[r].first >= 3 * st[r].L ? st[r].L : 0);
         ok && i + st[r].L < st[r].last; i++) {
      double d = start[r][i + st[r].L] - start[r][i];
      step = isnan(step) ? d : step;
      ok = d == step; /* exactly: the lowering's ties must fall alike */
    }
  free(st);
  return ok;
}
