/* zb_format_internal.h — what the zb_format_*.c files share inside libzb;
 * zb_format.h is the public side. zb_format_action.c owns the action
 * string grammar, zb_format_csv.c the CSV layout, zb_format_report.c the
 * JSON report and Chrome trace, zb_format_draw.c the SVG and ASCII
 * timelines.
 */
#ifndef ZB_FORMAT_INTERNAL_H
#define ZB_FORMAT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "zb_format.h"

/* Parses exactly s[0..n) (not NUL-terminated) as one action string into
 * *out; *out is untouched on failure. The empty span is ZB_ERR_PARSE. */
zb_err zb_action_parse_span(const char *s, size_t n, zb_action *out, zb_diag *diag);

/* Writes one rank's list as a CSV row ended by '\n' (zb_format_csv.c):
 * an overlapped pair stays one cell while its two actions are adjacent. */
void zb_csv_write_row(const zb_rank_list *l, zb_buf *out);

/* The placement's name in reports: "loop" or "v". */
static inline const char *placement_name(zb_placement pl) {
  return pl == ZB_PLACE_V ? "v" : "loop";
}

/* Chunk (0-based position among a rank's stages) of a stage: stage / p
 * holds for both placements. */
static inline int stage_chunk(const zb_schedule *s, int stage) {
  return (stage >= 0 && s->p > 0) ? stage / s->p : 0;
}

/* true when sim carries per-action times for every rank of s. */
static inline bool sim_matches(const zb_schedule *s, const zb_sim_result *sim) {
  return s && sim && sim->p == s->p && sim->start && (sim->end || sim->op_time);
}

/* Shared by the Chrome trace writers (zb_format_report.c): the
 * thread_name and thread_sort_index events of ranks 0..p-1 of process pid
 * ("rank R"), and one complete event per compute op of s at sim's times
 * multiplied by scale (to microseconds), each preceded by ",\n". */
void zb_fmt_trace_rank_threads(int p, int pid, zb_buf *out);
void zb_fmt_trace_plan_events(const zb_schedule *s, const zb_sim_result *sim, int pid, double scale,
                              zb_buf *out);

/* Shared by the SVG writers (zb_format_draw.c). */
typedef struct zb_rgb {
  int r, g, b;
} zb_rgb;
/* Appends s as XML character data (escaped; bytes XML 1.0 forbids become
 * '?'). */
void zb_fmt_xml_text(zb_buf *b, const char *s);
/* Base colour of a compute kind (F blue, B orange, W green, BW purple),
 * lightened towards white for later chunks of v. */
zb_rgb zb_fmt_op_colour(zb_op op, int chunk, int v);
/* Whether text on c should be black. */
bool zb_fmt_is_light(zb_rgb c);
/* A "nice" tick step (1, 2 or 5 times a power of ten) for about ten ticks
 * over span. */
double zb_fmt_tick_step(double span);

#endif
