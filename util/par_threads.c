/* par_threads.c — see zb_par_threads.h. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "zb_par_threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>

#include "zb_alloc.h"

typedef struct par_piece {
  zb_par_fn fn;
  void *arg;
  int k;
} par_piece;

static void *par_piece_main(void *p) {
  par_piece *pc = p;
  pc->fn(pc->arg, pc->k);
  return NULL;
}

/* Piece k runs on thread k - 1 (k >= 1), piece 0 here; more pieces than
 * the width run in waves. */
static void par_threads_run(const zb_par *par, zb_par_fn fn, void *arg, int n) {
  int width = par->width > 1 ? par->width : 1;
  if (width > n)
    width = n > 0 ? n : 1;
  par_piece *pieces = zb_malloc(sizeof *pieces * (size_t)width);
  pthread_t *th = zb_malloc(sizeof *th * (size_t)width);
  bool *started = zb_malloc(sizeof *started * (size_t)width);
  for (int base = 0; base < n; base += width) {
    int wave = n - base < width ? n - base : width;
    for (int j = 1; j < wave; j++) {
      pieces[j] = (par_piece){.fn = fn, .arg = arg, .k = base + j};
      started[j] = pthread_create(&th[j], NULL, par_piece_main, &pieces[j]) == 0;
    }
    fn(arg, base);
    for (int j = 1; j < wave; j++)
      if (started[j])
        pthread_join(th[j], NULL);
      else
        fn(arg, base + j);
  }
  free(pieces);
  free(th);
  free(started);
}

zb_par zb_par_threads(int width) {
  return (zb_par){.run = width > 1 ? par_threads_run : NULL, .width = width > 1 ? width : 1};
}

int zb_par_plan_width(void) {
  int cpus = zb_par_cpus();
  return cpus < ZB_PAR_PLAN_MAX ? cpus : ZB_PAR_PLAN_MAX;
}

int zb_par_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return 1;
  int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}
