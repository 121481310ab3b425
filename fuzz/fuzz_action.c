/* fuzz_action.c — PyTorch action strings (lib/zb_format.h): what every CSV
 * cell and every old-form Assignment carries. Any bytes must parse or fail
 * with a message. The notation has one spelling per action (no signs,
 * spaces or leading zeros), so both ways round must hold exactly:
 *   text that parses formats back to the same text, and parses again to
 *   the same action;
 *   an action built from the input's bytes (any kind, stage, microbatch)
 *   formats to text that parses back to that action.
 */
#include <string.h>

#include "fuzz.h"
#include "zb_format.h"

/* The FSDP kinds and the gradient reduction's wait carry no microbatch. */
static bool has_mb(zb_op op) {
  return op != ZB_OP_UNSHARD && op != ZB_OP_RESHARD && op != ZB_OP_REDUCE_GRAD &&
         op != ZB_OP_WAIT_REDUCE_GRAD;
}

static void check_parses_back(const zb_action *a, const char *text) {
  zb_action b;
  zb_diag d = {{0}};
  zb_err err = zb_action_parse(text, &b, &d);
  FUZZ_CHECK(err == ZB_OK, "\"%s\", formatted from an action, does not parse: %s", text, d.msg);
  FUZZ_CHECK(b.op == a->op && b.stage == a->stage && b.mb == a->mb && b.peer == -1 && !b.batch && !b.overlap,
             "\"%s\" parses to op %d stage %d mb %d, not op %d stage %d mb %d", text, b.op, b.stage, b.mb,
             a->op, a->stage, a->mb);
}

/* The text direction: s is the whole input, NUL-terminated. */
static void check_text(const char *s) {
  zb_action a;
  zb_diag d = {{0}};
  zb_err err = zb_action_parse(s, &a, &d);
  if (err != ZB_OK) {
    FUZZ_CHECK(d.msg[0], "error %d without a message", (int)err);
    return;
  }
  char buf[64];
  int n = zb_action_format(&a, buf, (int)sizeof buf);
  FUZZ_CHECK(n > 0 && n < (int)sizeof buf, "formatting gives %d characters", n);
  FUZZ_CHECK(strcmp(buf, s) == 0, "\"%s\" formats back as \"%s\"", s, buf);
  check_parses_back(&a, buf);
}

static int32_t get_i32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* The action direction, from the first nine bytes. */
static void check_action(const uint8_t *p) {
  zb_action a = {
      .op = (uint8_t)(p[0] % ZB_OP_COUNT_), .stage = get_i32(p + 1), .mb = get_i32(p + 5), .peer = -1};
  if (!has_mb((zb_op)a.op))
    a.mb = -1;
  if (a.op == ZB_OP_NONE || a.stage < 0 || (has_mb((zb_op)a.op) && a.mb < 0))
    return; /* no string names these */
  char buf[64];
  int n = zb_action_format(&a, buf, (int)sizeof buf);
  FUZZ_CHECK(n > 0 && n < (int)sizeof buf, "formatting gives %d characters", n);
  check_parses_back(&a, buf);
  char small[4]; /* a short buffer is cut and terminated, and the length still reported */
  FUZZ_CHECK(zb_action_format(&a, small, (int)sizeof small) == n && strlen(small) == (n < 3 ? (size_t)n : 3),
             "formatting into 4 bytes");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  memcpy(s, data, size);
  s[size] = '\0';
  check_text(s);
  free(s);
  if (size >= 9)
    check_action(data);
  return 0;
}
