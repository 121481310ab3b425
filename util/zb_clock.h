/* zb_clock.h — zb's one clock module. Monotonic time (CLOCK_MONOTONIC,
 * system-wide, so timestamps from different threads and processes of a
 * host compare) for durations and timelines; wall-clock time (CLOCK_REALTIME)
 * only for what people read: log lines, job and event timestamps. */
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

/* Wall-clock time in milliseconds since the Unix epoch. Does not block. */
static inline int64_t zb_clock_unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
