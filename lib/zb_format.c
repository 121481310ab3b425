/* zb_format.c — schedules in and out of text: PyTorch action strings, CSV,
 * the JSON plan report, Chrome trace events, an SVG and an ASCII timeline.
 *
 * Readers parse from memory and touch their outputs only on success;
 * writers append to a zb_buf. Nothing here performs I/O.
 */
#include "zb_format.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"

/* ------------------------------------------------------------------ */
/* Action strings                                                      */
/* ------------------------------------------------------------------ */

/* PyTorch's kind names. Multi-letter names come first, so a longer name
 * wins should a one-letter name ever be its prefix. */
typedef struct kind_name {
  const char *text;
  zb_op op;
  bool has_mb;
} kind_name;

static const kind_name kind_names[] = {
    {"SEND_F", ZB_OP_SEND_F, true},
    {"RECV_F", ZB_OP_RECV_F, true},
    {"SEND_B", ZB_OP_SEND_B, true},
    {"RECV_B", ZB_OP_RECV_B, true},
    {"UNSHARD", ZB_OP_UNSHARD, false},
    {"RESHARD", ZB_OP_RESHARD, false},
    {"REDUCE_GRAD", ZB_OP_REDUCE_GRAD, false},
    {"F", ZB_OP_F, true},
    {"I", ZB_OP_B, true},
    {"W", ZB_OP_W, true},
    {"B", ZB_OP_BW, true},
};
#define N_KIND_NAMES ((int)(sizeof kind_names / sizeof kind_names[0]))
#define KIND_LIST "F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD"

static const kind_name *kind_of_op(zb_op op) {
  for (int k = 0; k < N_KIND_NAMES; k++)
    if (kind_names[k].op == op)
      return &kind_names[k];
  return NULL;
}

/* Copies s[0..n) into q for a message: quoted-safe, at most 40 bytes shown,
 * unprintable bytes as '?', "..." when cut. */
static void quote_for_diag(const char *s, size_t n, char *q, size_t qlen) {
  size_t shown = n > 40 ? 40 : n, k = 0;
  for (size_t i = 0; i < shown && k + 1 < qlen; i++) {
    unsigned char c = (unsigned char)s[i];
    q[k++] = (c < 0x20 || c >= 0x7f || c == '"') ? '?' : (char)c;
  }
  if (shown < n)
    for (int d = 0; d < 3 && k + 1 < qlen; d++)
      q[k++] = '.';
  q[k] = '\0';
}

typedef enum number_status { NUM_OK, NUM_NONE, NUM_LEADING_ZERO, NUM_TOO_LARGE } number_status;

/* Reads a non-negative decimal at s[*i..n) without sign or leading zeros
 * (so the text round-trips) into *v, advancing *i past the digits. */
static number_status read_number(const char *s, size_t n, size_t *i, int32_t *v) {
  size_t start = *i;
  int64_t x = 0;
  while (*i < n && s[*i] >= '0' && s[*i] <= '9') {
    x = x * 10 + (s[*i] - '0');
    if (x > INT32_MAX)
      return NUM_TOO_LARGE;
    (*i)++;
  }
  if (*i == start)
    return NUM_NONE;
  if (*i - start > 1 && s[start] == '0')
    return NUM_LEADING_ZERO;
  *v = (int32_t)x;
  return NUM_OK;
}

/* Parses exactly s[0..n) into *out; *out is untouched on failure. */
static zb_err parse_action_span(const char *s, size_t n, zb_action *out, zb_diag *diag) {
  char q[48];
  quote_for_diag(s, n, q, sizeof q);
  if (n == 0)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "empty action string: expected <stage><kind><microbatch>, e.g. \"0F1\"");

  size_t i = 0;
  int32_t stage = 0, mb = -1;
  switch (read_number(s, n, &i, &stage)) {
  case NUM_OK: break;
  case NUM_NONE:
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "bad action \"%s\": expected a stage number (digits) first, as in \"0F1\"", q);
  case NUM_LEADING_ZERO:
    return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": stage number has a leading zero", q);
  case NUM_TOO_LARGE:
    return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": stage number is too large", q);
  }

  const kind_name *kind = NULL;
  for (int k = 0; k < N_KIND_NAMES; k++) {
    size_t kl = strlen(kind_names[k].text);
    if (n - i >= kl && memcmp(s + i, kind_names[k].text, kl) == 0) {
      kind = &kind_names[k];
      i += kl;
      break;
    }
  }
  if (!kind)
    return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": expected a kind (%s) after the stage number",
                       q, KIND_LIST);

  if (kind->has_mb) {
    switch (read_number(s, n, &i, &mb)) {
    case NUM_OK: break;
    case NUM_NONE:
      return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": expected a microbatch number after %s", q,
                         kind->text);
    case NUM_LEADING_ZERO:
      return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": microbatch number has a leading zero", q);
    case NUM_TOO_LARGE:
      return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": microbatch number is too large", q);
    }
  } else if (i < n && s[i] >= '0' && s[i] <= '9') {
    return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": %s takes no microbatch number", q, kind->text);
  }
  if (i != n)
    return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": unexpected text after \"%.*s\"", q, (int)i, s);

  *out = (zb_action){.op = kind->op, .stage = stage, .mb = mb, .peer = -1, .batch = false};
  return ZB_OK;
}

/* Parses s as a whole. The empty string is a parse error here: an empty
 * CSV cell means ZB_OP_NONE, but a lone action string must name one. */
zb_err zb_action_parse(const char *s, zb_action *out, zb_diag *diag) {
  if (!s || !out)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "zb_action_parse: NULL argument");
  return parse_action_span(s, strlen(s), out, diag);
}

/* snprintf-like: writes at most len bytes (NUL included) and returns the
 * full length of the string. ZB_OP_NONE is "". FSDP kinds ignore mb. */
int zb_action_format(const zb_action *a, char *buf, int len) {
  size_t cap = len > 0 ? (size_t)len : 0;
  char *dst = cap ? buf : NULL;
  const kind_name *kind = kind_of_op(a->op);
  if (a->op == ZB_OP_NONE || !kind)
    return snprintf(dst, cap, "%s", "");
  if (kind->has_mb)
    return snprintf(dst, cap, "%d%s%d", (int)a->stage, kind->text, (int)a->mb);
  return snprintf(dst, cap, "%d%s", (int)a->stage, kind->text);
}

/* ------------------------------------------------------------------ */
/* CSV                                                                 */
/* ------------------------------------------------------------------ */

static void rows_push(zb_rank_list *row, zb_action a) {
  if (row->n == row->cap) {
    row->cap = row->cap ? row->cap * 2 : 16;
    row->actions = zb_realloc(row->actions, sizeof *row->actions * (size_t)row->cap);
  }
  row->actions[row->n++] = a;
}

static void rows_free(zb_rank_list *rows, int n) {
  for (int r = 0; r < n; r++)
    free(rows[r].actions);
  free(rows);
}

static bool is_blank(char c) {
  return c == ' ' || c == '\t';
}

/* Parses one line (no line ending) into row. A zero-length line is a row
 * with no actions; otherwise every ','-separated cell is one action, an
 * empty cell (after trimming spaces and tabs) being ZB_OP_NONE. */
static zb_err parse_csv_line(const char *line, size_t n, int row_no, zb_rank_list *row, zb_diag *diag) {
  if (n == 0)
    return ZB_OK;
  size_t pos = 0;
  for (int col = 1;; col++) {
    size_t end = pos;
    while (end < n && line[end] != ',')
      end++;
    size_t a = pos, b = end;
    while (a < b && is_blank(line[a]))
      a++;
    while (b > a && is_blank(line[b - 1]))
      b--;
    zb_action act = {.op = ZB_OP_NONE, .stage = -1, .mb = -1, .peer = -1, .batch = false};
    if (b > a) {
      zb_diag inner;
      if (parse_action_span(line + a, b - a, &act, &inner) != ZB_OK)
        return zb_diag_set(diag, ZB_ERR_PARSE, "row %d, column %d: %s", row_no, col, inner.msg);
    }
    rows_push(row, act);
    if (end == n)
      break;
    pos = end + 1;
  }
  return ZB_OK;
}

/* Reads a CSV schedule; see zb_format.h. Lines may end in "\n" or "\r\n";
 * the last may lack one. Spaces and tabs around a cell are ignored. */
zb_err zb_csv_parse(const char *text, size_t len, zb_placement placement, zb_schedule **out, zb_diag *diag) {
  if ((!text && len) || !out)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "zb_csv_parse: NULL argument");
  if (placement != ZB_PLACE_LOOP && placement != ZB_PLACE_V)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "zb_csv_parse: unknown placement %d", (int)placement);

  zb_err err = ZB_OK;
  zb_rank_list *rows = NULL;
  int n_rows = 0, cap_rows = 0;
  size_t pos = 0;
  while (pos < len) {
    size_t end = pos;
    while (end < len && text[end] != '\n')
      end++;
    size_t line_end = end;
    if (line_end > pos && text[line_end - 1] == '\r')
      line_end--;
    if (n_rows == cap_rows) {
      cap_rows = cap_rows ? cap_rows * 2 : 8;
      rows = zb_realloc(rows, sizeof *rows * (size_t)cap_rows);
    }
    rows[n_rows] = (zb_rank_list){0};
    n_rows++;
    err = parse_csv_line(text + pos, line_end - pos, n_rows, &rows[n_rows - 1], diag);
    if (err != ZB_OK)
      goto fail;
    pos = end < len ? end + 1 : end;
  }
  if (n_rows == 0) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "empty CSV: expected one row of actions per rank");
    goto fail;
  }

  int64_t max_stage = -1, max_mb = -1;
  for (int r = 0; r < n_rows; r++)
    for (int i = 0; i < rows[r].n; i++) {
      const zb_action *a = &rows[r].actions[i];
      if (a->op == ZB_OP_NONE)
        continue;
      if (a->stage > max_stage)
        max_stage = a->stage;
      if (a->mb > max_mb)
        max_mb = a->mb;
    }
  if (max_stage < 0) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "CSV has %d row(s) but no actions", n_rows);
    goto fail;
  }
  if (max_mb < 0) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "CSV has no action with a microbatch number");
    goto fail;
  }
  int64_t n_stages = max_stage + 1;
  if (n_stages % n_rows != 0) {
    err = zb_diag_set(diag, ZB_ERR_PARSE,
                      "the largest stage is %lld, so there are %lld stages, which is not a multiple of the "
                      "%d rows (ranks): stages per rank must be whole",
                      (long long)max_stage, (long long)n_stages, n_rows);
    goto fail;
  }
  int v = (int)(n_stages / n_rows);
  if (placement == ZB_PLACE_V && v != 2) {
    err = zb_diag_set(diag, ZB_ERR_PARSE,
                      "V placement needs 2 stages per rank, the CSV has %d (%lld stages, %d rows)", v,
                      (long long)n_stages, n_rows);
    goto fail;
  }
  if (max_mb + 1 > INT32_MAX) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "microbatch number %lld is too large", (long long)max_mb);
    goto fail;
  }

  zb_schedule *s = zb_schedule_new(n_rows, v, (int)(max_mb + 1), placement);
  for (int r = 0; r < n_rows; r++)
    s->ranks[r] = rows[r]; /* hand the action arrays over */
  free(rows);
  zb_format_fill_peers(s);
  *out = s;
  return ZB_OK;

fail:
  rows_free(rows, n_rows);
  return err;
}

/* Writes s as CSV (one row per rank, '\n' after every row). ZB_OP_NONE is
 * an empty cell. Not carried (PyTorch's notation has no place for them):
 * comm peers, which the reader derives again from placement, and batch
 * flags; a rank whose only action is NONE reads back as an empty rank. */
void zb_csv_write(const zb_schedule *s, zb_buf *out) {
  char cell[64];
  for (int r = 0; r < s->p; r++) {
    const zb_rank_list *l = &s->ranks[r];
    for (int i = 0; i < l->n; i++) {
      if (i)
        zb_buf_append(out, ",", 1);
      int n = zb_action_format(&l->actions[i], cell, (int)sizeof cell);
      zb_buf_append(out, cell, (size_t)(n < (int)sizeof cell ? n : (int)sizeof cell - 1));
    }
    zb_buf_append(out, "\n", 1);
  }
}

/* Sets comm peers: SEND_F at stage s goes to the rank of s+1, RECV_F comes
 * from s-1, SEND_B goes to s-1, RECV_B comes from s+1. A partner stage
 * outside [0, p*v) gives peer -1 (the validator reports it). */
void zb_format_fill_peers(zb_schedule *s) {
  int n_stages = zb_schedule_stages(s);
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      zb_action *a = &s->ranks[r].actions[i];
      if (!zb_op_is_comm(a->op))
        continue;
      int64_t other =
          (a->op == ZB_OP_SEND_F || a->op == ZB_OP_RECV_B) ? (int64_t)a->stage + 1 : (int64_t)a->stage - 1;
      bool ok = a->stage >= 0 && a->stage < n_stages && other >= 0 && other < n_stages;
      a->peer = ok ? zb_stage_rank(s, (int)other) : -1;
    }
}

/* ------------------------------------------------------------------ */
/* Shared helpers of the writers                                       */
/* ------------------------------------------------------------------ */

static const char *placement_name(zb_placement pl) {
  return pl == ZB_PLACE_V ? "v" : "loop";
}

/* Chunk (0-based position among a rank's stages) of a stage: stage / p
 * holds for both placements. */
static int stage_chunk(const zb_schedule *s, int stage) {
  return (stage >= 0 && s->p > 0) ? stage / s->p : 0;
}

/* true when sim carries per-action times for every rank of s. */
static bool sim_matches(const zb_schedule *s, const zb_sim_result *sim) {
  return s && sim && sim->p == s->p && sim->start && sim->end;
}

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
  json_key(out, "makespan");
  zb_buf_json_num(out, sim ? sim->makespan : NAN);
  json_key(out, "bubble_ratio");
  zb_buf_json_num(out, sim ? sim->bubble_ratio : NAN);
  json_key(out, "bubble_ratio_paper");
  zb_buf_json_num(out, sim ? sim->bubble_ratio_paper : NAN);
  json_key(out, "peak_memory");
  if (sim && sim->peak_memory_units) {
    zb_buf_puts(out, "[");
    for (int k = 0; k < sim->p; k++) {
      if (k)
        zb_buf_puts(out, ", ");
      zb_buf_json_num(out, sim->peak_memory_units[k]);
    }
    zb_buf_puts(out, "]");
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
  }
  zb_buf_puts(out, s && s->p ? "\n  ]\n}\n" : "]\n}\n");
}

/* ------------------------------------------------------------------ */
/* Chrome trace                                                        */
/* ------------------------------------------------------------------ */

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
  for (int r = 0; r < s->p; r++) {
    zb_buf_printf(out,
                  ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, "
                  "\"args\": {\"name\": \"rank %d\"}}",
                  r, r);
    zb_buf_printf(out,
                  ",\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, "
                  "\"args\": {\"sort_index\": %d}}",
                  r, r);
  }
  char act[64];
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (!zb_op_is_compute(a->op))
        continue;
      zb_action_format(a, act, (int)sizeof act);
      zb_buf_printf(
          out,
          ",\n{\"name\": \"%s s%d mb%d\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": ",
          zb_op_name(a->op), (int)a->stage, (int)a->mb, zb_op_name(a->op), r);
      zb_buf_json_num(out, sim->start[r][i] * 1000.0);
      zb_buf_puts(out, ", \"dur\": ");
      zb_buf_json_num(out, (sim->end[r][i] - sim->start[r][i]) * 1000.0);
      zb_buf_puts(out, ", \"args\": {\"action\": ");
      zb_buf_json_str(out, act);
      zb_buf_printf(out, ", \"stage\": %d, \"microbatch\": %d, \"chunk\": %d}}", (int)a->stage, (int)a->mb,
                    stage_chunk(s, a->stage));
    }
  zb_buf_puts(out, "\n]}\n");
}

/* ------------------------------------------------------------------ */
/* SVG timeline                                                        */
/* ------------------------------------------------------------------ */

/* Appends s as XML character data (escaped; bytes XML 1.0 forbids become
 * '?'). */
static void xml_text(zb_buf *b, const char *s) {
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

typedef struct rgb {
  int r, g, b;
} rgb;

/* Base colour of a compute kind (F blue, B orange, W green, BW purple),
 * lightened towards white for later chunks. */
static rgb op_colour(zb_op op, int chunk, int v) {
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

static bool is_light(rgb c) {
  return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b > 150.0;
}

/* A "nice" tick step (1, 2 or 5 times a power of ten) for about ten ticks. */
static double tick_step(double span) {
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
      double t0 = sim->start[r][i], t1 = sim->end[r][i];
      double x = SVG_LEFT + t0 * scale, w = (t1 - t0) * scale;
      if (!isfinite(x) || !isfinite(w) || w < 0)
        continue;
      rgb c = op_colour(a->op, stage_chunk(s, a->stage), s->v);
      zb_action_format(a, act, (int)sizeof act);
      snprintf(tip, sizeof tip, "%s stage %d mb %d (%s): %g to %g", zb_op_name(a->op), (int)a->stage,
               (int)a->mb, act, t0, t1);
      zb_buf_printf(out,
                    "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"#%02x%02x%02x\" "
                    "stroke=\"#ffffff\" stroke-width=\"0.5\"><title>",
                    x, y, w, SVG_LANE_H, c.r, c.g, c.b);
      xml_text(out, tip);
      zb_buf_puts(out, "</title></rect>\n");
      char mbtxt[16];
      int digits = snprintf(mbtxt, sizeof mbtxt, "%d", (int)a->mb);
      if (w >= 6.5 * digits + 4)
        zb_buf_printf(out, "<text x=\"%.2f\" y=\"%d\" class=\"mb\" fill=\"%s\">%s</text>\n", x + w / 2,
                      y + SVG_LANE_H / 2 + 4, is_light(c) ? "#000000" : "#ffffff", mbtxt);
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
  xml_text(out, title);
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
    double step = tick_step(makespan);
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
    rgb c = op_colour(ops[k], 0, s->v);
    zb_buf_printf(out, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"#%02x%02x%02x\"/>\n", x,
                  legend_y - 10, c.r, c.g, c.b);
    zb_buf_printf(out, "<text x=\"%d\" y=\"%d\" class=\"lbl\">", x + 16, legend_y);
    xml_text(out, names[k]);
    zb_buf_puts(out, "</text>\n");
    x += 16 + 7 * (int)strlen(names[k]) + 28; /* about 7 px per glyph at 12 px */
  }
  if (s->v > 1) {
    zb_buf_printf(out, "<text x=\"%d\" y=\"%d\" class=\"lbl\">", x, legend_y);
    xml_text(out, "lighter: later chunk");
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
      double lo = ceil(sim->start[r][i] / dt - 0.5), hi = ceil(sim->end[r][i] / dt - 0.5);
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
