/* zb_par_threads.h — a zb_par (lib/zb_par.h) that runs the pieces of each
 * call on POSIX threads: piece 0 on the caller's, the others on threads
 * started for the call and joined before it returns (libzb's pieces are
 * tens of milliseconds or more, starting a thread a few microseconds). A
 * piece whose thread cannot start runs on the caller's afterwards. */
#ifndef ZB_PAR_THREADS_H
#define ZB_PAR_THREADS_H

#include "zb_par.h"

/* A runner for up to width pieces at once (width <= 1: one after
 * another). Holds no resources: nothing to free. */
zb_par zb_par_threads(int width);
/* The processors this process may run on (sched_getaffinity), at least 1. */
int zb_par_cpus(void);
/* How many threads one plan borrows (zb_job_plan, zbctl plan, the scale
 * benchmark): the processors, up to ZB_PAR_PLAN_MAX; lowering at scale
 * splits well up to a few (docs/schedules.md, Planning pipeline). */
#define ZB_PAR_PLAN_MAX 4
int zb_par_plan_width(void);

#endif
