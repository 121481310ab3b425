/* zb_format_measured.c — one measured iteration beside its plan, as a
 * Chrome trace and as an SVG (`zbctl trace`). Part of zb_format.h; both
 * writers only append to a zb_buf.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "zb_format_internal.h"

/* The measured process's time 0: the first compute op's start over all
 * ranks (the simulator's makespan starts there too); with no compute op,
 * the first op's; with none, 0. */
static double measured_origin(const zb_measured_view *v) {
  double first = INFINITY, first_any = INFINITY;
  for (int r = 0; r < v->p; r++)
    for (int i = 0; i < v->ranks[r].n; i++) {
      const zb_tl_op *o = &v->ranks[r].ops[i];
      if (o->group_size == 0 && o->start < first)
        first = o->start;
      if (o->start < first_any)
        first_any = o->start;
    }
  return isfinite(first) ? first : isfinite(first_any) ? first_any : 0.0;
}

/* The last measured op's end, from the origin. */
static double measured_extent(const zb_measured_view *v, double origin) {
  double last = 0;
  for (int r = 0; r < v->p; r++)
    for (int i = 0; i < v->ranks[r].n; i++)
      if (v->ranks[r].ops[i].end - origin > last)
        last = v->ranks[r].ops[i].end - origin;
  return last;
}

/* An op's event name: "F s2 mb5", or "comm RECV_F s2 mb5 (+3)" for a
 * transport group of four actions. */
static void op_label(const zb_tl_op *o, char *buf, size_t len) {
  if (o->group_size == 0)
    snprintf(buf, len, "%s s%d mb%d", zb_op_name(o->op), o->stage, o->mb);
  else if (o->group_size > 1)
    snprintf(buf, len, "comm %s s%d mb%d (+%d)", zb_op_name(o->op), o->stage, o->mb, o->group_size - 1);
  else
    snprintf(buf, len, "comm %s s%d mb%d", zb_op_name(o->op), o->stage, o->mb);
}

/* Seconds as microseconds to the nanosecond: the ranks' clocks are whole
 * microseconds apart from seconds-sized bases, the rest is noise. */
static double to_us(double seconds) {
  return round(seconds * 1e9) / 1e3;
}

/* A figure for a label: the simulator's exact zero may come out as -1e-16. */
static double tidy(double x) {
  return fabs(x) < 5e-9 ? 0.0 : x;
}

static bool have_plan(const zb_measured_view *v) {
  return sim_matches(v->sched, v->sim);
}

/* ------------------------------------------------------------------ */
/* Chrome trace                                                        */
/* ------------------------------------------------------------------ */

static void json_field(zb_buf *out, const char *key, double x) {
  zb_buf_printf(out, ", \"%s\": ", key);
  zb_buf_json_num(out, x);
}

/* The iteration's figures as JSON members, each after ", ". */
static void json_figures(const zb_measured_view *v, zb_buf *out) {
  json_field(out, "span_seconds", v->span);
  json_field(out, "bubble_ratio", v->bubble_ratio);
  json_field(out, "bubble_ratio_paper", v->bubble_ratio_paper);
  json_field(out, "predicted_bubble_ratio", v->predicted_bubble_ratio);
  json_field(out, "predicted_bubble_ratio_paper", v->predicted_bubble_ratio_paper);
  zb_buf_printf(out, ", \"predicted_from_learned\": %s", v->predicted_from_learned ? "true" : "false");
}

/* Process 0: the plan's metadata and its compute ops. */
static void trace_planned(const zb_measured_view *v, zb_buf *out) {
  const zb_sim_result *sim = v->sim;
  zb_buf_puts(out,
              "\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": ");
  zb_buf_json_str(out, v->planned_name ? v->planned_name : "planned");
  json_field(out, "makespan_seconds", sim->makespan);
  json_field(out, "bubble_ratio", sim->bubble_ratio);
  json_field(out, "bubble_ratio_paper", sim->bubble_ratio_paper);
  zb_buf_printf(out,
                "}},\n{\"name\": \"process_labels\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": "
                "{\"labels\": \"makespan %.3f ms, bubble %.4f (paper %.4f)\"}}",
                sim->makespan * 1e3, tidy(sim->bubble_ratio), tidy(sim->bubble_ratio_paper));
  zb_buf_puts(out, ",\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, "
                   "\"args\": {\"sort_index\": 0}}");
  zb_fmt_trace_rank_threads(v->sched->p, 0, out);
  zb_fmt_trace_plan_events(v->sched, v->sim, 0, 1e6, out);
}

/* Process 1's metadata: its name with the figures, labels, and one thread
 * per rank with that rank's compute, comm and idle seconds. */
static void trace_measured_meta(const zb_measured_view *v, const zb_tl_summary *sum, zb_buf *out) {
  zb_buf_printf(out,
                "\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, \"args\": {\"name\": "
                "\"measured iteration %d\", \"iteration\": %d, \"schedule\": ",
                v->iteration, v->iteration);
  zb_buf_json_str(out, v->schedule ? v->schedule : "");
  json_figures(v, out);
  zb_buf_printf(
      out,
      "}},\n{\"name\": \"process_labels\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, \"args\": "
      "{\"labels\": \"span %.3f ms, bubble %.4f (predicted %.4f), paper %.4f (predicted %.4f)%s\"}}",
      v->span * 1e3, tidy(v->bubble_ratio), tidy(v->predicted_bubble_ratio), tidy(v->bubble_ratio_paper),
      tidy(v->predicted_bubble_ratio_paper),
      v->predicted_from_learned ? ", predicted from learned costs" : "");
  zb_buf_puts(out, ",\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, "
                   "\"args\": {\"sort_index\": 1}}");
  for (int r = 0; r < v->p; r++) {
    zb_buf_printf(out,
                  ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, \"args\": "
                  "{\"name\": \"rank %d\"",
                  r, r);
    if (sum) {
      json_field(out, "compute_seconds", sum->compute[r]);
      json_field(out, "comm_seconds", sum->comm[r]);
      json_field(out, "idle_seconds", sum->idle[r]);
    }
    zb_buf_printf(out,
                  "}},\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, "
                  "\"args\": {\"sort_index\": %d}}",
                  r, r);
  }
}

/* Process 1's events: every op of every rank from the origin. */
static void trace_measured_ops(const zb_measured_view *v, double origin, zb_buf *out) {
  char name[96];
  for (int r = 0; r < v->p; r++)
    for (int i = 0; i < v->ranks[r].n; i++) {
      const zb_tl_op *o = &v->ranks[r].ops[i];
      double t0 = o->start - origin, t1 = o->end - origin;
      double ts = t0 > 0 ? t0 : 0, dur = t1 - ts > 0 ? t1 - ts : 0;
      op_label(o, name, sizeof name);
      zb_buf_puts(out, ",\n{\"name\": ");
      zb_buf_json_str(out, name);
      zb_buf_printf(out, ", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"ts\": ",
                    o->group_size ? "comm" : zb_op_name(o->op), r);
      zb_buf_json_num(out, to_us(ts));
      zb_buf_puts(out, ", \"dur\": ");
      zb_buf_json_num(out, to_us(dur));
      zb_buf_printf(out, ", \"args\": {\"kind\": \"%s\", \"stage\": %d, \"microbatch\": %d",
                    zb_op_name(o->op), o->stage, o->mb);
      if (o->group_size)
        zb_buf_printf(out, ", \"group_size\": %d", o->group_size);
      if (t0 < 0)
        json_field(out, "posted_us", to_us(t0));
      zb_buf_puts(out, "}}");
    }
}

void zb_trace_write_measured(const zb_measured_view *v, zb_buf *out) {
  double origin = measured_origin(v);
  zb_tl_summary sum;
  zb_diag d;
  bool have_sum = zb_timeline_summarize(v->ranks, v->p, &sum, &d) == ZB_OK;
  zb_buf_printf(
      out, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"iteration\": %d, \"schedule\": ", v->iteration);
  zb_buf_json_str(out, v->schedule ? v->schedule : "");
  json_figures(v, out);
  zb_buf_puts(out,
              ", \"measured_time_zero\": \"the iteration's first compute op start\"}, \"traceEvents\": [");
  if (have_plan(v)) {
    trace_planned(v, out);
    zb_buf_puts(out, ",");
  }
  trace_measured_meta(v, have_sum ? &sum : NULL, out);
  trace_measured_ops(v, origin, out);
  zb_buf_puts(out, "\n]}\n");
  zb_tl_summary_free(&sum);
}

/* ------------------------------------------------------------------ */
/* SVG                                                                 */
/* ------------------------------------------------------------------ */

enum {
  MSVG_WIDTH = 1200,
  MSVG_LEFT = 80,
  MSVG_RIGHT = 30,
  MSVG_TOP = 64,
  MSVG_HEAD = 22, /* a section's heading above its lanes */
  MSVG_LANE_H = 20,
  MSVG_LANE_GAP = 4,
};

typedef struct msvg {
  zb_buf *out;
  double scale; /* pixels per second */
  int v;        /* chunks, for the colours */
} msvg;

/* A section's heading and p lane backgrounds with rank labels from y;
 * returns the y of the first lane. */
static int msvg_section(msvg *g, const char *heading, int p, int y) {
  zb_buf_printf(g->out, "<text x=\"10\" y=\"%d\" class=\"head\">", y + 14);
  zb_fmt_xml_text(g->out, heading);
  zb_buf_puts(g->out, "</text>\n");
  y += MSVG_HEAD;
  for (int r = 0; r < p; r++) {
    int ly = y + r * (MSVG_LANE_H + MSVG_LANE_GAP);
    zb_buf_printf(g->out, "<text x=\"10\" y=\"%d\" class=\"lbl\">rank %d</text>\n", ly + MSVG_LANE_H / 2 + 4,
                  r);
    zb_buf_printf(g->out,
                  "<rect class=\"lane\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#eeeeee\"/>\n",
                  MSVG_LEFT, ly, MSVG_WIDTH - MSVG_LEFT - MSVG_RIGHT, MSVG_LANE_H);
  }
  return y;
}

/* One op box from t0 to t1 (seconds from time 0) in the lane at y. */
static void msvg_box(msvg *g, const char *cls, zb_op op, int chunk, double t0, double t1, int y, int h,
                     const char *tip) {
  double x = MSVG_LEFT + (t0 > 0 ? t0 : 0) * g->scale, w = (t1 - (t0 > 0 ? t0 : 0)) * g->scale;
  if (!isfinite(x) || !isfinite(w))
    return;
  if (w < 0)
    w = 0;
  zb_rgb c = strcmp(cls, "op") == 0 ? zb_fmt_op_colour(op, chunk, g->v) : (zb_rgb){0x9a, 0x9a, 0x9a};
  zb_buf_printf(g->out,
                "<rect class=\"%s\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"#%02x%02x%02x\" "
                "stroke=\"#ffffff\" stroke-width=\"0.5\"><title>",
                cls, x, y, w, h, c.r, c.g, c.b);
  zb_fmt_xml_text(g->out, tip);
  zb_buf_puts(g->out, "</title></rect>\n");
}

static void msvg_planned(msvg *g, const zb_measured_view *v, int y0) {
  const zb_schedule *s = v->sched;
  char tip[160], act[64];
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (!zb_op_is_compute(a->op))
        continue;
      double t0 = v->sim->start[r][i], t1 = zb_sim_end(v->sim, a, r, i);
      zb_action_format(a, act, (int)sizeof act);
      snprintf(tip, sizeof tip, "planned %s s%d mb%d (%s): %.3f to %.3f ms", zb_op_name(a->op), (int)a->stage,
               (int)a->mb, act, t0 * 1e3, t1 * 1e3);
      msvg_box(g, "op", a->op, stage_chunk(s, a->stage), t0, t1, y0 + r * (MSVG_LANE_H + MSVG_LANE_GAP),
               MSVG_LANE_H, tip);
    }
}

/* Transport groups first (thin, grey), then compute ops over them. */
static void msvg_measured(msvg *g, const zb_measured_view *v, double origin, int y0) {
  char tip[192], name[96];
  for (int pass = 0; pass < 2; pass++)
    for (int r = 0; r < v->p; r++)
      for (int i = 0; i < v->ranks[r].n; i++) {
        const zb_tl_op *o = &v->ranks[r].ops[i];
        bool comm = o->group_size != 0;
        if (comm != (pass == 0))
          continue;
        double t0 = o->start - origin, t1 = o->end - origin;
        op_label(o, name, sizeof name);
        snprintf(tip, sizeof tip, "measured %s: %.3f to %.3f ms", name, t0 * 1e3, t1 * 1e3);
        int y = y0 + r * (MSVG_LANE_H + MSVG_LANE_GAP);
        int chunk = v->p > 0 ? o->stage / v->p : 0;
        if (comm)
          msvg_box(g, "comm", o->op, 0, t0, t1, y + MSVG_LANE_H / 3, MSVG_LANE_H / 3, tip);
        else
          msvg_box(g, "op", o->op, chunk, t0, t1, y, MSVG_LANE_H, tip);
      }
}

/* The time axis at y over [0, tmax] seconds, ticks in milliseconds. */
static void msvg_axis(msvg *g, double tmax, int y) {
  int plot_w = MSVG_WIDTH - MSVG_LEFT - MSVG_RIGHT;
  zb_buf_printf(g->out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#444444\"/>\n", MSVG_LEFT, y,
                MSVG_LEFT + plot_w, y);
  if (g->scale > 0) {
    double step = zb_fmt_tick_step(tmax * 1e3);
    for (int k = 0; k * step <= tmax * 1e3 * (1 + 1e-9); k++) {
      double x = MSVG_LEFT + k * step * 1e-3 * g->scale;
      zb_buf_printf(g->out, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#444444\"/>\n", x, y,
                    x, y + 5);
      zb_buf_printf(g->out, "<text x=\"%.2f\" y=\"%d\" class=\"tick\">%g</text>\n", x, y + 17, k * step);
    }
  }
  zb_buf_printf(g->out, "<text x=\"10\" y=\"%d\" class=\"lbl\">ms</text>\n", y + 17);
  zb_buf_printf(g->out,
                "<text x=\"%d\" y=\"%d\" class=\"lbl\">F blue, B orange, W green, BW purple (lighter: later "
                "chunk); thin grey: a transport group (posting to completion)</text>\n",
                MSVG_LEFT, y + 38);
}

static void msvg_titles(msvg *g, const zb_measured_view *v) {
  char line[320];
  snprintf(line, sizeof line,
           "measured iteration %d (%s): span %.3f ms, bubble_ratio %.4f (predicted %.4f), "
           "bubble_ratio_paper %.4f (predicted %.4f)%s",
           v->iteration, v->schedule ? v->schedule : "", v->span * 1e3, tidy(v->bubble_ratio),
           tidy(v->predicted_bubble_ratio), tidy(v->bubble_ratio_paper),
           tidy(v->predicted_bubble_ratio_paper),
           v->predicted_from_learned ? "; predicted from learned costs" : "");
  zb_buf_puts(g->out, "<text x=\"10\" y=\"22\" class=\"title\">");
  zb_fmt_xml_text(g->out, line);
  zb_buf_puts(g->out, "</text>\n");
  if (have_plan(v))
    snprintf(line, sizeof line, "%s: makespan %.3f ms, bubble_ratio %.4f, bubble_ratio_paper %.4f",
             v->planned_name ? v->planned_name : "planned", v->sim->makespan * 1e3,
             tidy(v->sim->bubble_ratio), tidy(v->sim->bubble_ratio_paper));
  else
    snprintf(line, sizeof line, "no plan to draw");
  zb_buf_puts(g->out, "<text x=\"10\" y=\"42\" class=\"lbl\">");
  zb_fmt_xml_text(g->out, line);
  zb_buf_puts(g->out, "</text>\n");
}

void zb_svg_write_measured(const zb_measured_view *v, zb_buf *out) {
  bool plan = have_plan(v);
  int pp = plan ? v->sched->p : 0;
  double origin = measured_origin(v);
  double tmax = measured_extent(v, origin);
  if (plan && v->sim->makespan > tmax)
    tmax = v->sim->makespan;
  int lanes = MSVG_LANE_H + MSVG_LANE_GAP;
  int planned_y = MSVG_TOP, measured_y = planned_y + (plan ? MSVG_HEAD + pp * lanes + 10 : 0);
  int axis_y = measured_y + MSVG_HEAD + v->p * lanes + 2;
  int height = axis_y + 48;
  msvg g = {.out = out, .v = plan ? v->sched->v : 1};
  g.scale = tmax > 0 && isfinite(tmax) ? (MSVG_WIDTH - MSVG_LEFT - MSVG_RIGHT) / tmax : 0.0;
  zb_buf_puts(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  zb_buf_printf(out,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                "font-family=\"sans-serif\">\n",
                MSVG_WIDTH, height, MSVG_WIDTH, height);
  zb_buf_puts(out,
              "<style>.lbl{font-size:12px;fill:#222222}.head{font-size:13px;font-weight:bold;fill:#111111}"
              ".tick{font-size:10px;fill:#444444;text-anchor:middle}.title{font-size:14px;fill:#111111}"
              "</style>\n");
  zb_buf_printf(out, "<rect class=\"bg\" x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n",
                MSVG_WIDTH, height);
  msvg_titles(&g, v);
  if (plan)
    msvg_planned(&g, v, msvg_section(&g, v->planned_name ? v->planned_name : "planned", pp, planned_y));
  char head[64];
  snprintf(head, sizeof head, "measured iteration %d", v->iteration);
  msvg_measured(&g, v, origin, msvg_section(&g, head, v->p, measured_y));
  msvg_axis(&g, tmax, axis_y);
  zb_buf_puts(out, "</svg>\n");
}
