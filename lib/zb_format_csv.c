/* zb_format_csv.c — schedules as CSV (one row of action strings per rank),
 * read from memory and written to a zb_buf, and the comm peers a CSV does
 * not carry. Part of zb_format.h; zb_format_csv_comm.c writes the
 * csv-comm rows (waits and reductions) through zb_csv_write_row.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_format_internal.h"

/* Limits on a CSV schedule's shape (docs/formats.md): far above any real
 * pipeline, far below what would exhaust memory. */
#define ZB_CSV_MAX_RANKS 4096
#define ZB_CSV_MAX_STAGES 65536
#define ZB_CSV_MAX_MICROBATCHES (1 << 20)
_Static_assert(ZB_CSV_MAX_RANKS <= ZB_MAX_RANKS, "a file's ranks fit a schedule (zb_schedule_new)");
#define ZB_CSV_MAX_CELLS (1 << 25)

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

/* Parses one overlapped pair "(A;B)OVERLAP_F_B" (no surrounding space)
 * into its two actions, the first marked as overlapped with the second. */
static zb_err parse_overlap(const char *s, size_t n, zb_rank_list *row, zb_diag *diag) {
  static const char tail[] = ")OVERLAP_F_B";
  size_t tl = sizeof tail - 1;
  const char *semi = memchr(s, ';', n);
  if (n < tl + 3 || memcmp(s + n - tl, tail, tl) != 0 || !semi)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "bad action \"%.*s\": a cell starting with '(' must be an overlapped pair "
                       "\"(<action>;<action>)OVERLAP_F_B\"",
                       (int)(n > 40 ? 40 : n), s);
  zb_action a = {.peer = -1}, b = {.peer = -1};
  zb_diag inner;
  if (zb_action_parse_span(s + 1, (size_t)(semi - s - 1), &a, &inner) != ZB_OK ||
      zb_action_parse_span(semi + 1, (size_t)(s + n - tl - semi - 1), &b, &inner) != ZB_OK)
    return zb_diag_set(diag, ZB_ERR_PARSE, "in an OVERLAP_F_B pair: %s", inner.msg);
  if (!zb_op_is_compute(a.op) || !zb_op_is_compute(b.op))
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "bad action \"%.*s\": an OVERLAP_F_B pair holds two compute actions",
                       (int)(n > 40 ? 40 : n), s);
  a.overlap = true;
  rows_push(row, a);
  rows_push(row, b);
  return ZB_OK;
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
    if (b > a && line[a] == '(') {
      zb_diag inner;
      if (parse_overlap(line + a, b - a, row, &inner) != ZB_OK)
        return zb_diag_set(diag, ZB_ERR_PARSE, "row %d, column %d: %s", row_no, col, inner.msg);
      if (end == n)
        break;
      pos = end + 1;
      continue;
    }
    if (b > a) {
      zb_diag inner;
      if (zb_action_parse_span(line + a, b - a, &act, &inner) != ZB_OK)
        return zb_diag_set(diag, ZB_ERR_PARSE, "row %d, column %d: %s", row_no, col, inner.msg);
    }
    rows_push(row, act);
    if (end == n)
      break;
    pos = end + 1;
  }
  return ZB_OK;
}

/* The rows read so far, one per line of the text. */
typedef struct csv_rows {
  zb_rank_list *rows;
  int n, cap;
} csv_rows;

static zb_rank_list *csv_rows_add(csv_rows *t) {
  if (t->n == t->cap) {
    t->cap = t->cap ? t->cap * 2 : 8;
    t->rows = zb_realloc(t->rows, sizeof *t->rows * (size_t)t->cap);
  }
  t->rows[t->n] = (zb_rank_list){0};
  return &t->rows[t->n++];
}

/* Splits text into lines ("\n" or "\r\n"; the last may lack one) and parses
 * each into a row. On failure the rows read so far stay in *t. */
static zb_err csv_read_rows(const char *text, size_t len, csv_rows *t, zb_diag *diag) {
  size_t pos = 0;
  while (pos < len) {
    size_t end = pos;
    while (end < len && text[end] != '\n')
      end++;
    size_t line_end = end;
    if (line_end > pos && text[line_end - 1] == '\r')
      line_end--;
    zb_rank_list *row = csv_rows_add(t);
    zb_err err = parse_csv_line(text + pos, line_end - pos, t->n, row, diag);
    if (err != ZB_OK)
      return err;
    pos = end < len ? end + 1 : end;
  }
  return ZB_OK;
}

/* The schedule's shape as the rows imply it: the rank count is the row
 * count, v = stages / rows (must divide; 2 for V placement), m = the
 * largest microbatch + 1. */
static zb_err csv_shape(const csv_rows *t, zb_placement placement, int *v_out, int *m_out, zb_diag *diag) {
  int n_rows = t->n;
  if (n_rows == 0)
    return zb_diag_set(diag, ZB_ERR_PARSE, "empty CSV: expected one row of actions per rank");
  int64_t max_stage = -1, max_mb = -1;
  for (int r = 0; r < n_rows; r++)
    for (int i = 0; i < t->rows[r].n; i++) {
      const zb_action *a = &t->rows[r].actions[i];
      if (a->op == ZB_OP_NONE)
        continue;
      if (a->stage > max_stage)
        max_stage = a->stage;
      if (a->mb > max_mb)
        max_mb = a->mb;
    }
  if (max_stage < 0)
    return zb_diag_set(diag, ZB_ERR_PARSE, "CSV has %d row(s) but no actions", n_rows);
  if (max_mb < 0)
    return zb_diag_set(diag, ZB_ERR_PARSE, "CSV has no action with a microbatch number");
  int64_t n_stages = max_stage + 1;
  /* what the planner's per-(stage, microbatch) arrays can hold: a file
   * naming stage 2147483646 must not make them allocate gigabytes */
  if (n_rows > ZB_CSV_MAX_RANKS || n_stages > ZB_CSV_MAX_STAGES || max_mb + 1 > ZB_CSV_MAX_MICROBATCHES ||
      n_stages * (max_mb + 1) > ZB_CSV_MAX_CELLS)
    return zb_diag_set(
        diag, ZB_ERR_PARSE,
        "the CSV is too large: %d rows, %lld stages, %lld microbatches (at most %d, %d, %d, and "
        "stages x microbatches at most %d)",
        n_rows, (long long)n_stages, (long long)(max_mb + 1), ZB_CSV_MAX_RANKS, ZB_CSV_MAX_STAGES,
        ZB_CSV_MAX_MICROBATCHES, ZB_CSV_MAX_CELLS);
  if (n_stages % n_rows != 0)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "the largest stage is %lld, so there are %lld stages, which is not a multiple of the "
                       "%d rows (ranks): stages per rank must be whole",
                       (long long)max_stage, (long long)n_stages, n_rows);
  int v = (int)(n_stages / n_rows);
  if (placement == ZB_PLACE_V && v != 2)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "V placement needs 2 stages per rank, the CSV has %d (%lld stages, %d rows)", v,
                       (long long)n_stages, n_rows);
  if (max_mb + 1 > INT32_MAX)
    return zb_diag_set(diag, ZB_ERR_PARSE, "microbatch number %lld is too large", (long long)max_mb);
  *v_out = v;
  *m_out = (int)(max_mb + 1);
  return ZB_OK;
}

/* V when every row r holds only stages r and 2p-1-r, some of them the
 * second (PyTorch's loader infers it the same way); else loop. */
static zb_placement csv_infer_placement(const csv_rows *t) {
  int p = t->n;
  bool v_ok = true, second = false;
  for (int r = 0; r < p && v_ok; r++)
    for (int i = 0; i < t->rows[r].n; i++) {
      const zb_action *a = &t->rows[r].actions[i];
      if (a->op == ZB_OP_NONE)
        continue;
      v_ok &= a->stage == r || a->stage == 2 * p - 1 - r;
      second |= a->stage == 2 * p - 1 - r && a->stage != r;
    }
  return v_ok && second ? ZB_PLACE_V : ZB_PLACE_LOOP;
}

/* Every stage runs the same microbatches 0..m-1 of each compute kind, m
 * being how many a stage runs: a stage and kind numbered past that is
 * named with the microbatch it lacks (PyTorch's Schedule1F1B export has
 * the last stage's forwards as 1..m). */
static zb_err csv_check_numbering(const csv_rows *t, int n_stages, zb_diag *diag) {
  static const zb_op kinds[] = {ZB_OP_F, ZB_OP_B, ZB_OP_W, ZB_OP_BW};
  int *cnt = zb_calloc((size_t)n_stages * 4, sizeof(int)),
      *lo = zb_malloc(sizeof(int) * (size_t)n_stages * 4),
      *hi = zb_malloc(sizeof(int) * (size_t)n_stages * 4), m = 0;
  for (int r = 0; r < t->n; r++)
    for (int i = 0; i < t->rows[r].n; i++) {
      const zb_action *a = &t->rows[r].actions[i];
      for (int k = 0; k < 4; k++)
        if (a->op == kinds[k] && a->stage >= 0 && a->stage < n_stages) {
          int x = a->stage * 4 + k;
          lo[x] = cnt[x] && lo[x] < a->mb ? lo[x] : a->mb;
          hi[x] = cnt[x] && hi[x] > a->mb ? hi[x] : a->mb;
          m = ++cnt[x] > m ? cnt[x] : m;
        }
    }
  zb_err err = ZB_OK;
  for (int x = 0; x < n_stages * 4 && !err; x++)
    if (cnt[x] && hi[x] >= m) {
      int stage = x / 4;
      const char *kind = zb_op_name(kinds[x % 4]);
      bool bug = kinds[x % 4] == ZB_OP_F && stage == n_stages - 1 && lo[x] == 1;
      err = zb_diag_set(
          diag, ZB_ERR_PARSE,
          "stage %d has no %s of microbatch %d: its %s microbatches run %d..%d, where a stage runs "
          "%d of each kind (0..%d)%s",
          stage, kind, lo[x] > 0 ? 0 : m, kind, lo[x], hi[x], m, m - 1,
          bug ? "; PyTorch's Schedule1F1B export numbers the last stage's forwards from 1, and "
                "PyTorch's own _validate_schedule refuses this file too"
              : "");
    }
  free(cnt);
  free(lo);
  free(hi);
  return err;
}

/* Reads a CSV schedule; see zb_format.h. Lines may end in "\n" or "\r\n";
 * the last may lack one. Spaces and tabs around a cell are ignored. */
zb_err zb_csv_parse(const char *text, size_t len, zb_placement placement, zb_schedule **out, zb_diag *diag) {
  if ((!text && len) || !out)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "zb_csv_parse: NULL argument");
  if (placement != ZB_PLACE_LOOP && placement != ZB_PLACE_V && placement != ZB_PLACE_INFER)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "zb_csv_parse: unknown placement %d", (int)placement);
  csv_rows t = {0};
  int v = 0, m = 0;
  zb_err err = csv_read_rows(text, len, &t, diag);
  if (err == ZB_OK && placement == ZB_PLACE_INFER && t.n > 0)
    placement = csv_infer_placement(&t);
  if (err == ZB_OK)
    err = csv_shape(&t, placement, &v, &m, diag);
  if (err == ZB_OK)
    err = csv_check_numbering(&t, v * t.n, diag);
  if (err != ZB_OK) {
    rows_free(t.rows, t.n);
    return err;
  }
  zb_schedule *s = zb_schedule_new(t.n, v, m, placement);
  for (int r = 0; r < t.n; r++)
    s->ranks[r] = t.rows[r]; /* hand the action arrays over */
  free(t.rows);
  zb_format_fill_peers(s);
  *out = s;
  return ZB_OK;
}

/* Writes one cell: the action, or an overlapped pair "(A;B)OVERLAP_F_B"
 * (then *i moves past B). */
static void csv_cell(const zb_rank_list *l, int *i, zb_buf *out) {
  char cell[64];
  const zb_action *a = &l->actions[*i];
  /* a pair stays one only while nothing (a lowering's comm) came between */
  bool pair = a->overlap && *i + 1 < l->n && zb_op_is_compute(l->actions[*i + 1].op);
  if (pair)
    zb_buf_append(out, "(", 1);
  int n = zb_action_format(a, cell, (int)sizeof cell);
  zb_buf_append(out, cell, (size_t)(n < (int)sizeof cell ? n : (int)sizeof cell - 1));
  if (pair) {
    n = zb_action_format(&l->actions[++*i], cell, (int)sizeof cell);
    zb_buf_append(out, ";", 1);
    zb_buf_append(out, cell, (size_t)(n < (int)sizeof cell ? n : (int)sizeof cell - 1));
    zb_buf_append(out, ")OVERLAP_F_B", 12);
  }
}

/* Writes one rank's list as a CSV row ended by '\n'. ZB_OP_NONE is an
 * empty cell. Not carried (PyTorch's notation has no place for them):
 * comm peers, which the reader derives again from placement, and batch
 * flags; a rank whose only action is NONE reads back as an empty rank. */
void zb_csv_write_row(const zb_rank_list *l, zb_buf *out) {
  for (int i = 0; i < l->n; i++) {
    if (i)
      zb_buf_append(out, ",", 1);
    csv_cell(l, &i, out);
  }
  zb_buf_append(out, "\n", 1);
  zb_buf_flush(out);
}

void zb_csv_write(const zb_schedule *s, zb_buf *out) {
  for (int r = 0; r < s->p; r++)
    zb_csv_write_row(&s->ranks[r], out);
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
