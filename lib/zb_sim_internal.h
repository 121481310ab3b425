/* zb_sim_internal.h — what the simulator's two modes share (zb_sim.c, the
 * blocking run; zb_sim_device.c, the device-ordered one): the cost check,
 * a result's allocation, and the figures made from its per-rank sums.
 * Not for callers outside lib/zb_sim*.c.
 */
#ifndef ZB_SIM_INTERNAL_H
#define ZB_SIM_INTERNAL_H

#include <stdbool.h>

#include "zb_sim.h"

/* ZB_ERR_INVALID_ARG unless c describes s's stages. */
zb_err zb_sim_check_costs(const zb_schedule *s, const zb_costs *c, zb_diag *diag);
/* A zeroed result for s (caller frees): figures, and with times both
 * times of every action (their blocks not cleared). */
zb_sim_result *zb_sim_result_alloc(const zb_schedule *s, bool times);
/* From r's makespan, max_span, busy and peak_memory: its bubble ratios
 * and peak_memory_units. */
void zb_sim_fill_figures(const zb_schedule *s, const zb_costs *c, zb_sim_result *r);

#endif
