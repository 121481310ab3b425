/* zb_par.h — how a caller lends libzb its threads. libzb starts none (it
 * keeps no threads, no I/O, no globals); where its work splits into
 * independent pieces (lowering's ranks, validating and simulating one
 * plan) it hands them to the caller's runner, which may run them one
 * after another or at once (util/zb_par_threads.h runs them on threads).
 * A NULL runner, or width 1, means one after another on the calling
 * thread: the results are the same either way.
 */
#ifndef ZB_PAR_H
#define ZB_PAR_H

/* One piece of work: piece k of arg's. Pieces of one run share nothing
 * they write. */
typedef void (*zb_par_fn)(void *arg, int k);

typedef struct zb_par {
  /* Runs fn(arg, k) for every k in 0..n-1 and returns when all are done. */
  void (*run)(const struct zb_par *par, zb_par_fn fn, void *arg, int n);
  int width; /* how many pieces are worth running at once */
  void *ctx; /* the runner's own */
} zb_par;

/* How many pieces to split work into under par (1 without a runner). */
static inline int zb_par_width(const zb_par *par) {
  return par && par->run && par->width > 1 ? par->width : 1;
}

/* Where share k of `pieces` even shares of n items starts (k = pieces:
 * n): share k is [zb_par_share(n, k, pieces), zb_par_share(n, k+1, pieces)). */
static inline int zb_par_share(int n, int k, int pieces) {
  return (int)((long)n * k / pieces);
}

/* Runs the n pieces through par, or one after another without one. */
static inline void zb_par_run(const zb_par *par, zb_par_fn fn, void *arg, int n) {
  if (zb_par_width(par) > 1 && n > 1) {
    par->run(par, fn, arg, n);
    return;
  }
  for (int k = 0; k < n; k++)
    fn(arg, k);
}

#endif
