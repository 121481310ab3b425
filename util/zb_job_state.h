/* zb_job_state.h — a job's states, defined once for the coordinator, its
 * store, the wire glue and zbctl. The numbers are zb.v1.JobState's
 * (common/zb_wire.c asserts it at compile time) and are what the store
 * keeps, so they never change. A job goes PENDING -> RUNNING -> one of the
 * three final states (docs/architecture.md, A job's life). */
#ifndef ZB_JOB_STATE_H
#define ZB_JOB_STATE_H

#include <stdbool.h>

typedef enum zb_job_state {
  ZB_JOB_UNSPECIFIED = 0,
  ZB_JOB_PENDING = 1,
  ZB_JOB_RUNNING = 2,
  ZB_JOB_SUCCEEDED = 3,
  ZB_JOB_FAILED = 4,
  ZB_JOB_CANCELLED = 5,
} zb_job_state;

/* "PENDING", ...; "?" for a number that is no state. */
static inline const char *zb_job_state_name(int state) {
  static const char *const names[] = {"UNSPECIFIED", "PENDING", "RUNNING",
                                      "SUCCEEDED",   "FAILED",  "CANCELLED"};
  return state >= 0 && state <= ZB_JOB_CANCELLED ? names[state] : "?";
}

/* SUCCEEDED, FAILED and CANCELLED. */
static inline bool zb_job_state_final(int state) {
  return state >= ZB_JOB_SUCCEEDED && state <= ZB_JOB_CANCELLED;
}

#endif
