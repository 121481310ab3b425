/* zb_clock.h — the worker's one clock: CLOCK_MONOTONIC, system-wide, so
 * timestamps from different threads and processes on a host compare. */
#ifndef ZB_CLOCK_H
#define ZB_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic time in nanoseconds. Does not block. */
static inline int64_t zb_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Monotonic time in seconds. Does not block. */
static inline double zb_clock_s(void) {
  return (double)zb_clock_ns() * 1e-9;
}

#endif
