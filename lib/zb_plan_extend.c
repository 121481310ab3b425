/* Prolonging a schedule's steady state (docs/schedules.md, Planning at
 * scale).
 *
 * Between warm-up and cool-down every rank of a pipeline schedule repeats
 * one period: the same ops in the same order, q microbatches on each
 * time. A schedule for m microbatches is the one for fewer with that
 * period repeated more often, so the generators whose work grows faster
 * than the output (the V building block's squeeze, W placed by timing)
 * can plan a short run and repeat its period. Each rank's list is cut
 * inside its periodic stretch, k more periods go in, and what follows the
 * cut moves k microbatches on. Where in the stretch a rank is cut does
 * not matter: the inserted periods are the stretch's own continuation.
 */
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_plan_internal.h"

/* Periods a stretch must span to count as the steady state, not a
 * coincidence of the warm-up. */
#define EXT_MIN_PERIODS 3

/* Whether y is x again, q microbatches on. */
static bool ext_repeats(const zb_action *x, const zb_action *y, int q) {
  return y->op == x->op && y->stage == x->stage && y->mb == x->mb + q && y->peer == x->peer &&
         y->batch == x->batch && y->overlap == x->overlap;
}

static int ext_key_cmp(const void *x, const void *y) {
  int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return (a > b) - (a < b);
}

/* Whether a period (L actions from a) can repeat without two copies of
 * one (op, stage, microbatch): the microbatches it holds of each (op,
 * stage) differ modulo q. keys: room for L. */
static bool ext_distinct(const zb_action *a, int L, int q, int64_t *keys) {
  for (int i = 0; i < L; i++)
    keys[i] = ((int64_t)a[i].stage * ZB_OP_COUNT_ + a[i].op) * q + a[i].mb % q;
  qsort(keys, (size_t)L, sizeof *keys, ext_key_cmp);
  for (int i = 1; i < L; i++)
    if (keys[i] == keys[i - 1])
      return false;
  return true;
}

/* The microbatches that every (op, stage) of the stretch a[0..len) holds
 * in common: [*lo, *hi], empty when *lo > *hi. A rank lists each (op,
 * stage) in microbatch order, so its first and last are its range. */
static void ext_common(const zb_action *a, int len, int *lo, int *hi) {
  enum { MAX_KINDS = 64 };
  typedef struct {
    int op, stage, first, last;
  } ext_kind;
  ext_kind kind[MAX_KINDS];
  int n = 0;
  for (int i = 0; i < len; i++) {
    int k = 0;
    while (k < n && (kind[k].op != a[i].op || kind[k].stage != a[i].stage))
      k++;
    if (k == MAX_KINDS) { /* more than a generator's ranks hold: no common range */
      *lo = 1, *hi = 0;
      return;
    }
    if (k == n)
      kind[n++] = (ext_kind){a[i].op, a[i].stage, a[i].mb, a[i].mb};
    kind[k].last = a[i].mb;
  }
  for (int k = 0; k < n; k++) {
    *lo = kind[k].first > *lo ? kind[k].first : *lo;
    *hi = kind[k].last < *hi ? kind[k].last : *hi;
  }
}

/* Where rank list l (L actions a period, q microbatches on each time) is
 * cut: an index i such that the period before it continues after it, in
 * the middle of the longest periodic stretch; -1 when no stretch spans
 * EXT_MIN_PERIODS periods. [*lo, *hi] narrows to the microbatches the
 * stretch holds of every (op, stage). */
static int ext_cut(const zb_rank_list *l, int L, int q, int64_t *keys, int *lo, int *hi) {
  int best_s = 0, best_len = -1, run_s = 0;
  for (int j = 0; j + L <= l->n; j++) {
    bool on = j + L < l->n && ext_repeats(&l->actions[j], &l->actions[j + L], q);
    if (on)
      continue;
    if (j - run_s > best_len) /* the stretch [run_s, j) ended here */
      best_s = run_s, best_len = j - run_s;
    run_s = j + 1;
  }
  /* [best_s, best_s + best_len): actions that repeat L on; the stretch
   * they and their repeats form spans best_len + L actions */
  if (best_len + L < EXT_MIN_PERIODS * L)
    return -1;
  ext_common(&l->actions[best_s], best_len + L, lo, hi);
  int cut = best_s + L + (best_len - L) / L / 2 * L;
  return ext_distinct(&l->actions[cut - L], L, q, keys) ? cut : -1;
}

/* Rank r of s prolonged by k periods into out, cut at `cut`. */
static void ext_rank(const zb_rank_list *l, int L, int q, int cut, int k, zb_schedule *out, int r) {
  int n = l->n + k * L;
  zb_schedule_reserve(out, r, n);
  zb_action *dst = out->ranks[r].actions;
  memcpy(dst, l->actions, sizeof *dst * (size_t)cut);
  const zb_action *period = &l->actions[cut - L];
  int at = cut;
  for (int rep = 1; rep <= k; rep++)
    for (int i = 0; i < L; i++) {
      dst[at] = period[i];
      dst[at++].mb += rep * q;
    }
  for (int i = cut; i < l->n; i++) {
    dst[at] = l->actions[i];
    dst[at++].mb += k * q;
  }
  out->ranks[r].n = n;
}

/* Actions per period of each rank (per[r]) when every list is compute
 * only and holds the same number of actions per microbatch; the largest,
 * or 0 when one is not. */
static int ext_periods(const zb_schedule *s, int q, int *per) {
  int most = 0;
  for (int r = 0; r < s->p; r++) {
    const zb_rank_list *l = &s->ranks[r];
    for (int i = 0; i < l->n; i++) /* markers and comm carry no period */
      if (!zb_op_is_compute(l->actions[i].op))
        return 0;
    if (l->n == 0 || l->n % s->m != 0)
      return 0;
    per[r] = l->n / s->m * q;
    most = per[r] > most ? per[r] : most;
  }
  return most;
}

zb_schedule *zb_plan_extend(const zb_schedule *s, int m, int q) {
  if (q < 1 || m < s->m || (m - s->m) % q != 0)
    return NULL;
  int *cut = zb_malloc(sizeof(int) * (size_t)s->p), *per = zb_malloc(sizeof(int) * (size_t)s->p);
  int most = ext_periods(s, q, per);
  int64_t *keys = zb_malloc(sizeof(int64_t) * (size_t)(most > 0 ? most : 1));
  bool ok = most > 0;
  /* Each rank's stretch alone may be a pattern of the warm-up that a
   * short run repeats for a while (at p = 256, a run of 300 microbatches
   * has such stretches, and prolonged they deadlock). The steady state is
   * where every rank repeats at once: some microbatch must lie in every
   * rank's stretch for every (op, stage). */
  int lo = 0, hi = s->m;
  for (int r = 0; ok && r < s->p; r++)
    ok = (cut[r] = ext_cut(&s->ranks[r], per[r], q, keys, &lo, &hi)) >= 0;
  ok = ok && lo <= hi;
  zb_schedule *out = ok ? zb_schedule_new(s->p, s->v, m, s->placement) : NULL;
  for (int r = 0; out && r < s->p; r++)
    ext_rank(&s->ranks[r], per[r], q, cut[r], (m - s->m) / q, out, r);
  free(cut);
  free(per);
  free(keys);
  return out;
}

/* Plans with fewer actions than this are generated in full: cheap, and
 * the grids the families are measured on keep their exact generators. */
#define EXT_MIN_ACTIONS 131072

int zb_plan_extend_base(const zb_plan_request *req, int *q) {
  switch (req->family) {
  case ZB_FAMILY_V_HALF:
  case ZB_FAMILY_V_MIN: *q = 1; break;               /* the block repeats every microbatch */
  case ZB_FAMILY_ZB_INTERLEAVED: *q = req->p; break; /* a chunk's round of p microbatches */
  default: return 0;
  }
  /* warm-up, three periods and cool-down: a V's warm-up spans about p
   * microbatches, interleaved's one round per chunk */
  int base = 2 * req->p + EXT_MIN_PERIODS * *q;
  base += ((req->m - base) % *q + *q) % *q; /* the same microbatches modulo the period */
  int v = req->v > 0 ? req->v : zb_family_default_chunks(req->family);
  bool large = 3.0 * v * req->p * req->m >= EXT_MIN_ACTIONS;
  return large && 2 * base <= req->m ? base : 0;
}
