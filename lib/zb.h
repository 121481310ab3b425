/* zb.h — libzb, the pure schedule core of zb, in one include.
 *
 * libzb plans pipeline-parallel schedules (zero-bubble and the classic
 * families), checks them and predicts their cost. It is pure: libc and
 * libm only, no I/O, no threads, no globals; results go out through
 * pointers and zb_buf, failures come back as zb_err with a zb_diag.
 *
 * A schedule's way through it: generate (zb_plan.h, or read a CSV with
 * zb_format.h) -> lower (zb_lower.h: add SEND/RECV) -> validate
 * (zb_validate.h) -> simulate (zb_sim.h) -> write out (zb_format.h).
 * zb_planner.h runs the first four as one call: what every planning
 * caller (zbctl, the coordinator, tests, benchmarks) uses.
 * See docs/schedules.md for the vocabulary, families and models.
 */
#ifndef ZB_H
#define ZB_H

#include "zb_alloc.h"
#include "zb_buf.h"
#include "zb_err.h"
#include "zb_format.h"
#include "zb_lower.h"
#include "zb_plan.h"
#include "zb_planner.h"
#include "zb_schedule.h"
#include "zb_sim.h"
#include "zb_timeline.h"
#include "zb_validate.h"

#endif
