/* zb_format_action.c — PyTorch pipelining action strings ("0F1", "2I0",
 * "1SEND_F0", ...): parsing with explanatory diagnostics, and formatting.
 * Part of zb_format.h; the CSV reader parses its cells with
 * zb_action_parse_span (zb_format_internal.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zb_format_internal.h"

/* PyTorch's kind names. Multi-letter names come first, so a longer name
 * wins should a one-letter name ever be its prefix. */
typedef struct kind_name {
  const char *text;
  zb_op op;
  bool has_mb;
} kind_name;

static const kind_name kind_names[] = {
    {"WAIT_SEND_F", ZB_OP_WAIT_SEND_F, true},
    {"WAIT_SEND_B", ZB_OP_WAIT_SEND_B, true},
    {"WAIT_REDUCE_GRAD", ZB_OP_WAIT_REDUCE_GRAD, false},
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
#define KIND_LIST                                                                                            \
  "F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B, WAIT_SEND_F, WAIT_SEND_B, UNSHARD, RESHARD, REDUCE_GRAD, "    \
  "WAIT_REDUCE_GRAD"

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

/* Reads a non-negative decimal below `below` at s[*i..n) without sign or
 * leading zeros (so the text round-trips) into *v, advancing *i past the
 * digits. */
static number_status read_number(const char *s, size_t n, size_t *i, int32_t below, int32_t *v) {
  size_t start = *i;
  int64_t x = 0;
  while (*i < n && s[*i] >= '0' && s[*i] <= '9') {
    x = x * 10 + (s[*i] - '0');
    if (x >= below)
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
zb_err zb_action_parse_span(const char *s, size_t n, zb_action *out, zb_diag *diag) {
  char q[48];
  quote_for_diag(s, n, q, sizeof q);
  if (n == 0)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "empty action string: expected <stage><kind><microbatch>, e.g. \"0F1\"");

  size_t i = 0;
  int32_t stage = 0, mb = -1;
  switch (read_number(s, n, &i, ZB_MAX_STAGES + 1, &stage)) { /* what an action's field holds */
  case NUM_OK: break;
  case NUM_NONE:
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "bad action \"%s\": expected a stage number (digits) first, as in \"0F1\"", q);
  case NUM_LEADING_ZERO:
    return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": stage number has a leading zero", q);
  case NUM_TOO_LARGE:
    return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": stage number is too large (at most %d)", q,
                       ZB_MAX_STAGES);
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
    switch (read_number(s, n, &i, ZB_MAX_MICROBATCHES + 1, &mb)) {
    case NUM_OK: break;
    case NUM_NONE:
      return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": expected a microbatch number after %s", q,
                         kind->text);
    case NUM_LEADING_ZERO:
      return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": microbatch number has a leading zero", q);
    case NUM_TOO_LARGE:
      return zb_diag_set(diag, ZB_ERR_PARSE, "bad action \"%s\": microbatch number is too large (at most %d)",
                         q, ZB_MAX_MICROBATCHES);
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
  return zb_action_parse_span(s, strlen(s), out, diag);
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
