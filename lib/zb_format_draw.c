/* zb_format_draw.c — timelines of a simulated schedule for people: a
 * standalone SVG and an ASCII drawing for terminals. Part of zb_format.h;
 * both only append to a zb_buf.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_format_internal.h"

/* ------------------------------------------------------------------ */
/* SVG timeline                                                        */
/* ------------------------------------------------------------------ */

void zb_fmt_xml_text(zb_buf *b, const char *s) {
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    switch (*c) {
    case '&': zb_buf_puts(b, "&amp;"); break;
    case '<': zb_buf_puts(b, "&lt;"); break;
    case '>': zb_buf_puts(b, "&gt;"); break;
    case '"': zb_buf_puts(b, "&quot;"); break;
    case '\'': zb_buf_puts(b, "&apos;"); break;
    default:
      if (*c < 0x20 && *c != '\t' && *c != '\n')
        zb_buf_append(b, "?", 1);
      else
        zb_buf_append(b, (const char *)c, 1);
    }
  }
}

typedef zb_rgb rgb;

rgb zb_fmt_op_colour(zb_op op, int chunk, int v) {
  rgb c;
  switch (op) {
  case ZB_OP_F: c = (rgb){0x2f, 0x6d, 0xb5}; break;
  case ZB_OP_B: c = (rgb){0xe0, 0x7b, 0x1a}; break;
  case ZB_OP_W: c = (rgb){0x3a, 0x93, 0x3a}; break;
  default: c = (rgb){0x8e, 0x4f, 0xa8}; break;
  }
  double f = (v > 1 && chunk > 0) ? 0.55 * (double)chunk / (double)(v - 1) : 0.0;
  if (f > 0.55)
    f = 0.55;
  c.r += (int)((255 - c.r) * f);
  c.g += (int)((255 - c.g) * f);
  c.b += (int)((255 - c.b) * f);
  return c;
}

bool zb_fmt_is_light(rgb c) {
  return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b > 150.0;
}

double zb_fmt_tick_step(double span) {
  double raw = span / 10.0;
  double mag = pow(10.0, floor(log10(raw)));
  double norm = raw / mag;
  double k = norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10;
  return k * mag;
}

enum {
  SVG_WIDTH = 1200,
  SVG_LEFT = 80,
  SVG_RIGHT = 30,
  SVG_TOP = 44,
  SVG_LANE_H = 24,
  SVG_LANE_GAP = 6,
};

static void svg_lanes(const zb_schedule *s, const zb_sim_result *sim, double scale, zb_buf *out) {
  char act[64], tip[160];
  for (int r = 0; r < s->p; r++) {
    int y = SVG_TOP + r * (SVG_LANE_H + SVG_LANE_GAP);
    zb_buf_printf(out, "<text x=\"%d\" y=\"%d\" class=\"lbl\">rank %d</text>\n", 10, y + SVG_LANE_H / 2 + 4,
                  r);
    zb_buf_printf(out, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#eeeeee\"/>\n", SVG_LEFT, y,
                  SVG_WIDTH - SVG_LEFT - SVG_RIGHT, SVG_LANE_H);
    for (int i = 0; i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (!zb_op_is_compute(a->op))
        continue;
      double t0 = sim->start[r][i], t1 = zb_sim_end(sim, a, r, i);
      double x = SVG_LEFT + t0 * scale, w = (t1 - t0) * scale;
      if (!isfinite(x) || !isfinite(w) || w < 0)
        continue;
      rgb c = zb_fmt_op_colour(a->op, stage_chunk(s, a->stage), s->v);
      zb_action_format(a, act, (int)sizeof act);
      snprintf(tip, sizeof tip, "%s stage %d mb %d (%s): %g to %g", zb_op_name(a->op), (int)a->stage,
               (int)a->mb, act, t0, t1);
      zb_buf_printf(out,
                    "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"#%02x%02x%02x\" "
                    "stroke=\"#ffffff\" stroke-width=\"0.5\"><title>",
                    x, y, w, SVG_LANE_H, c.r, c.g, c.b);
      zb_fmt_xml_text(out, tip);
      zb_buf_puts(out, "</title></rect>\n");
      char mbtxt[16];
      int digits = snprintf(mbtxt, sizeof mbtxt, "%d", (int)a->mb);
      if (w >= 6.5 * digits + 4)
        zb_buf_printf(out, "<text x=\"%.2f\" y=\"%d\" class=\"mb\" fill=\"%s\">%s</text>\n", x + w / 2,
                      y + SVG_LANE_H / 2 + 4, zb_fmt_is_light(c) ? "#000000" : "#ffffff", mbtxt);
    }
  }
}

/* Writes a standalone SVG timeline; with no matching sim, a note saying so. */
void zb_svg_write(const zb_schedule *s, const zb_sim_result *sim, zb_buf *out) {
  bool have = sim_matches(s, sim);
  int p = s ? s->p : 0;
  int lanes_end = SVG_TOP + p * (SVG_LANE_H + SVG_LANE_GAP);
  int axis_y = lanes_end + 2;
  int legend_y = axis_y + 40;
  int height = legend_y + 24;
  int plot_w = SVG_WIDTH - SVG_LEFT - SVG_RIGHT;
  double makespan = have ? sim->makespan : 0.0;
  double scale = (makespan > 0 && isfinite(makespan)) ? plot_w / makespan : 0.0;

  zb_buf_puts(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  zb_buf_printf(out,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                "font-family=\"sans-serif\">\n",
                SVG_WIDTH, height, SVG_WIDTH, height);
  zb_buf_puts(out, "<style>.lbl{font-size:12px;fill:#222222}.mb{font-size:10px;text-anchor:middle}"
                   ".tick{font-size:10px;fill:#444444;text-anchor:middle}.title{font-size:14px;fill:#111111}"
                   "</style>\n");
  zb_buf_printf(out, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", SVG_WIDTH,
                height);

  char title[256];
  if (have)
    snprintf(title, sizeof title,
             "p=%d v=%d m=%d placement %s: makespan %g, bubble_ratio %.4f (global), bubble_ratio_paper %.4f",
             s->p, s->v, s->m, placement_name(s->placement), sim->makespan, sim->bubble_ratio,
             sim->bubble_ratio_paper);
  else
    snprintf(title, sizeof title, "no simulation: nothing to draw");
  zb_buf_printf(out, "<text x=\"%d\" y=\"24\" class=\"title\">", 10);
  zb_fmt_xml_text(out, title);
  zb_buf_puts(out, "</text>\n");
  if (!have) {
    zb_buf_puts(out, "</svg>\n");
    return;
  }

  svg_lanes(s, sim, scale, out);

  /* time axis */
  zb_buf_printf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#444444\"/>\n", SVG_LEFT, axis_y,
                SVG_LEFT + plot_w, axis_y);
  if (scale > 0) {
    double step = zb_fmt_tick_step(makespan);
    for (int k = 0; k * step <= makespan * (1 + 1e-9); k++) {
      double x = SVG_LEFT + k * step * scale;
      zb_buf_printf(out, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#444444\"/>\n", x,
                    axis_y, x, axis_y + 5);
      zb_buf_printf(out, "<text x=\"%.2f\" y=\"%d\" class=\"tick\">%g</text>\n", x, axis_y + 17, k * step);
    }
  }
  zb_buf_printf(out, "<text x=\"%d\" y=\"%d\" class=\"lbl\">time</text>\n", 10, axis_y + 17);

  /* legend */
  const zb_op ops[4] = {ZB_OP_F, ZB_OP_B, ZB_OP_W, ZB_OP_BW};
  const char *names[4] = {"F forward", "B input grad (PyTorch I)", "W weight grad",
                          "BW fused B+W (PyTorch B)"};
  int x = SVG_LEFT;
  for (int k = 0; k < 4; k++) {
    rgb c = zb_fmt_op_colour(ops[k], 0, s->v);
    zb_buf_printf(out, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"#%02x%02x%02x\"/>\n", x,
                  legend_y - 10, c.r, c.g, c.b);
    zb_buf_printf(out, "<text x=\"%d\" y=\"%d\" class=\"lbl\">", x + 16, legend_y);
    zb_fmt_xml_text(out, names[k]);
    zb_buf_puts(out, "</text>\n");
    x += 16 + 7 * (int)strlen(names[k]) + 28; /* about 7 px per glyph at 12 px */
  }
  if (s->v > 1) {
    zb_buf_printf(out, "<text x=\"%d\" y=\"%d\" class=\"lbl\">", x, legend_y);
    zb_fmt_xml_text(out, "lighter: later chunk");
    zb_buf_puts(out, "</text>\n");
  }
  zb_buf_puts(out, "</svg>\n");
}

/* ------------------------------------------------------------------ */
/* ASCII timeline                                                      */
/* ------------------------------------------------------------------ */

static char op_letter(zb_op op, int chunk) {
  char c = op == ZB_OP_F ? 'F' : op == ZB_OP_B ? 'B' : op == ZB_OP_W ? 'W' : 'X';
  return chunk > 0 ? (char)(c - 'A' + 'a') : c;
}

/* Writes the ASCII timeline: column c of `width` shows the op running at
 * the middle of [c, c+1) * makespan / width. */
void zb_ascii_write(const zb_schedule *s, const zb_sim_result *sim, int width, zb_buf *out) {
  if (!sim_matches(s, sim)) {
    zb_buf_puts(out, "(no simulation: nothing to draw)\n");
    return;
  }
  if (width <= 0)
    width = 100;
  int rank_w = 2;
  for (int k = s->p - 1; k >= 100; k /= 10)
    rank_w++;
  double dt = sim->makespan / width;
  char *line = zb_malloc((size_t)width + 1);
  for (int r = 0; r < s->p; r++) {
    memset(line, '.', (size_t)width);
    line[width] = '\0';
    for (int i = 0; dt > 0 && isfinite(dt) && i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (!zb_op_is_compute(a->op))
        continue;
      double lo = ceil(sim->start[r][i] / dt - 0.5), hi = ceil(zb_sim_end(sim, a, r, i) / dt - 0.5);
      if (lo < 0)
        lo = 0;
      if (hi > width)
        hi = width;
      char ch = op_letter(a->op, stage_chunk(s, a->stage));
      for (int c = (int)lo; c < (int)hi; c++)
        line[c] = ch;
    }
    zb_buf_printf(out, "rank %*d |%s|\n", rank_w, r, line);
  }
  free(line);

  char end_label[32];
  int end_len = snprintf(end_label, sizeof end_label, "%g", sim->makespan);
  int prefix = 5 + rank_w + 2; /* "rank " + number + " |" */
  if (width >= end_len + 2)
    zb_buf_printf(out, "%*s0%*s\n", prefix, "", width - 1, end_label);

  zb_buf_puts(out,
              "legend: F forward, B input grad (PyTorch I), W weight grad, X fused B+W (PyTorch B), . idle");
  zb_buf_puts(out, s->v > 1 ? "; lowercase: chunk >= 1\n" : "\n");
  zb_buf_printf(out,
                "makespan %g  bubble_ratio %.4f (global)  bubble_ratio_paper %.4f  peak memory (M_F units):",
                sim->makespan, sim->bubble_ratio, sim->bubble_ratio_paper);
  for (int r = 0; r < s->p; r++)
    zb_buf_printf(out, " %.4g", sim->peak_memory_units ? sim->peak_memory_units[r] : NAN);
  zb_buf_puts(out, "\n");
}
