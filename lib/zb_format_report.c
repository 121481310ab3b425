/* zb_format_report.c — machine-readable reports of a planned schedule:
 * the JSON plan report (`zbctl plan --format json`) and Chrome trace
 * events. Part of zb_format.h; both only append to a zb_buf.
 */
#include <math.h>

#include "zb_format_internal.h"

/* ------------------------------------------------------------------ */
/* JSON report                                                         */
/* ------------------------------------------------------------------ */

static void json_key(zb_buf *b, const char *key) {
  zb_buf_puts(b, ",\n  ");
  zb_buf_json_str(b, key);
  zb_buf_puts(b, ": ");
}

static void json_costs(const zb_plan_report *r, zb_buf *b) {
  if (!r->rank_costs && !r->costs) {
    zb_buf_puts(b, "null");
    return;
  }
  zb_buf_puts(b, "{");
  if (r->rank_costs) {
    const zb_rank_costs *rc = r->rank_costs;
    const char *names[6] = {"t_f", "t_b", "t_w", "m_f", "m_b", "m_w"};
    const double vals[6] = {rc->t_f, rc->t_b, rc->t_w, rc->m_f, rc->m_b, rc->m_w};
    for (int k = 0; k < 6; k++) {
      zb_buf_json_str(b, names[k]);
      zb_buf_puts(b, ": ");
      zb_buf_json_num(b, vals[k]);
      zb_buf_puts(b, ", ");
    }
  }
  zb_buf_puts(b, "\"t_comm\": ");
  zb_buf_json_num(b, r->costs ? r->costs->t_comm : r->rank_costs->t_comm);
  zb_buf_puts(b, "}");
}

/* One simulation's figures: makespan, the bubble ratios and peak memory
 * per rank, the first behind `first`, the others behind `sep`. */
static void json_figures(const zb_sim_result *sim, const char *first, const char *sep, zb_buf *b) {
  const char *names[3] = {"makespan", "bubble_ratio", "bubble_ratio_paper"};
  const double vals[3] = {sim ? sim->makespan : NAN, sim ? sim->bubble_ratio : NAN,
                          sim ? sim->bubble_ratio_paper : NAN};
  for (int k = 0; k < 3; k++) {
    zb_buf_puts(b, k ? sep : first);
    zb_buf_json_str(b, names[k]);
    zb_buf_puts(b, ": ");
    zb_buf_json_num(b, vals[k]);
  }
  zb_buf_puts(b, sep);
  zb_buf_puts(b, "\"peak_memory\": ");
  if (!sim || !sim->peak_memory_units) {
    zb_buf_puts(b, "null");
    return;
  }
  zb_buf_puts(b, "[");
  for (int k = 0; k < sim->p; k++) {
    if (k)
      zb_buf_puts(b, ", ");
    zb_buf_json_num(b, sim->peak_memory_units[k]);
  }
  zb_buf_puts(b, "]");
}

/* Writes the plan report as one JSON object; see zb_format.h. */
void zb_json_write(const zb_plan_report *r, zb_buf *out) {
  const zb_schedule *s = r->sched;
  const zb_sim_result *sim = r->sim;
  zb_buf_puts(out, "{\n  \"schedule\": ");
  if (r->schedule)
    zb_buf_json_str(out, r->schedule);
  else
    zb_buf_puts(out, "null");
  json_key(out, "ranks");
  zb_buf_printf(out, "%d", s ? s->p : 0);
  json_key(out, "chunks");
  zb_buf_printf(out, "%d", s ? s->v : 0);
  json_key(out, "microbatches");
  zb_buf_printf(out, "%d", s ? s->m : 0);
  json_key(out, "placement");
  if (s)
    zb_buf_json_str(out, placement_name(s->placement));
  else
    zb_buf_puts(out, "null");
  json_key(out, "costs");
  json_costs(r, out);
  json_key(out, "mem_limit");
  zb_buf_json_num(out, r->mem_limit_units > 0 ? r->mem_limit_units : NAN);
  json_figures(sim, ",\n  ", ",\n  ", out);
  json_key(out, "compute_only");
  if (r->sim_compute) {
    zb_buf_puts(out, "{");
    json_figures(r->sim_compute, "", ", ", out);
    zb_buf_puts(out, "}");
  } else {
    zb_buf_puts(out, "null");
  }
  json_key(out, "generation_seconds");
  zb_buf_json_num(out, r->generation_seconds);
  json_key(out, "actions");
  zb_buf_puts(out, "[");
  char cell[64];
  for (int k = 0; s && k < s->p; k++) {
    zb_buf_puts(out, k ? ",\n    [" : "\n    [");
    for (int i = 0; i < s->ranks[k].n; i++) {
      if (i)
        zb_buf_puts(out, ", ");
      zb_action_format(&s->ranks[k].actions[i], cell, (int)sizeof cell);
      zb_buf_json_str(out, cell);
    }
    zb_buf_puts(out, "]");
    zb_buf_flush(out);
  }
  zb_buf_puts(out, s && s->p ? "\n  ]\n}\n" : "]\n}\n");
}

/* ------------------------------------------------------------------ */
/* Chrome trace                                                        */
/* ------------------------------------------------------------------ */

void zb_fmt_trace_rank_threads(int p, int pid, zb_buf *out) {
  for (int r = 0; r < p; r++) {
    zb_buf_printf(out,
                  ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                  "\"args\": {\"name\": \"rank %d\"}}",
                  pid, r, r);
    zb_buf_printf(out,
                  ",\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                  "\"args\": {\"sort_index\": %d}}",
                  pid, r, r);
  }
}

void zb_fmt_trace_plan_events(const zb_schedule *s, const zb_sim_result *sim, int pid, double scale,
                              zb_buf *out) {
  char act[64];
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (!zb_op_is_compute(a->op))
        continue;
      zb_action_format(a, act, (int)sizeof act);
      zb_buf_printf(out,
                    ",\n{\"name\": \"%s s%d mb%d\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": "
                    "%d, \"ts\": ",
                    zb_op_name(a->op), (int)a->stage, (int)a->mb, zb_op_name(a->op), pid, r);
      zb_buf_json_num(out, sim->start[r][i] * scale);
      zb_buf_puts(out, ", \"dur\": ");
      zb_buf_json_num(out, (zb_sim_end(sim, a, r, i) - sim->start[r][i]) * scale);
      zb_buf_puts(out, ", \"args\": {\"action\": ");
      zb_buf_json_str(out, act);
      zb_buf_printf(out, ", \"stage\": %d, \"microbatch\": %d, \"chunk\": %d}}", (int)a->stage, (int)a->mb,
                    stage_chunk(s, a->stage));
      zb_buf_flush(out);
    }
}

/* Writes Chrome trace events; with no matching sim, an empty event list. */
void zb_trace_write(const zb_schedule *s, const zb_sim_result *sim, zb_buf *out) {
  zb_buf_puts(out, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [");
  if (!sim_matches(s, sim)) {
    zb_buf_puts(out, "]}\n");
    return;
  }
  zb_buf_printf(out,
                "\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, "
                "\"args\": {\"name\": \"zb pipeline p=%d v=%d m=%d\"}}",
                s->p, s->v, s->m);
  zb_fmt_trace_rank_threads(s->p, 0, out);
  zb_fmt_trace_plan_events(s, sim, 0, 1000.0, out);
  zb_buf_puts(out, "\n]}\n");
}
