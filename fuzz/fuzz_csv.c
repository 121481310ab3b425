/* fuzz_csv.c — PyTorch CSV schedules (lib/zb_format.h, zb_csv_parse), what
 * `zbctl plan --from-csv` imports, under each placement request (loop, V,
 * inferred). Any bytes must give ZB_OK or an error with a message. A
 * schedule that parses must write back as CSV that parses to the same
 * actions, and then go where zbctl takes it: a schedule the validator
 * accepts must simulate, and a compute-only one must lower to lists the
 * validator accepts again.
 */
#include <string.h>

#include "fuzz.h"
#include "zb_buf.h"
#include "zb_format.h"
#include "zb_lower.h"
#include "zb_sim.h"
#include "zb_validate.h"

/* Validation, simulation and lowering are linear in stages x microbatches,
 * which a few bytes can make large ("65535F0"); past this the harness
 * checks the parse and the round trip only, so runs stay fast. */
#define FUZZ_MAX_CELLS 4096

/* A rank of one empty cell writes as an empty line, which reads back as
 * a rank with no actions (zb_format_csv.c says so). */
static int row_len(const zb_rank_list *l) {
  return l->n == 1 && l->actions[0].op == ZB_OP_NONE ? 0 : l->n;
}

static bool action_equal(const zb_action *x, const zb_action *y) {
  return x->op == y->op && x->stage == y->stage && x->mb == y->mb && x->peer == y->peer &&
         x->batch == y->batch && x->overlap == y->overlap;
}

static void check_same(const zb_schedule *a, const zb_schedule *b) {
  FUZZ_CHECK(a->p == b->p && a->v == b->v && a->m == b->m && a->placement == b->placement,
             "shape %d/%d/%d/%d read back as %d/%d/%d/%d", a->p, a->v, a->m, (int)a->placement, b->p, b->v,
             b->m, (int)b->placement);
  for (int r = 0; r < a->p; r++) {
    const zb_rank_list *x = &a->ranks[r], *y = &b->ranks[r];
    FUZZ_CHECK(row_len(x) == row_len(y), "rank %d: %d actions read back as %d", r, x->n, y->n);
    for (int i = 0; i < row_len(x); i++)
      FUZZ_CHECK(action_equal(&x->actions[i], &y->actions[i]), "rank %d action %d changed in the round trip",
                 r, i);
  }
}

static void check_round_trip(const zb_schedule *s) {
  zb_buf out = {0};
  zb_csv_write(s, &out);
  zb_schedule *back = NULL;
  zb_diag d = {{0}};
  zb_err err = zb_csv_parse(out.data, out.len, s->placement, &back, &d);
  FUZZ_CHECK(err == ZB_OK, "the CSV written from a parsed schedule does not parse: %s", d.msg);
  check_same(s, back);
  zb_schedule_free(back);
  zb_buf_free(&out);
}

static bool has_send_waits(const zb_schedule *s) {
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++)
      if (s->ranks[r].actions[i].op == ZB_OP_WAIT_SEND_F || s->ranks[r].actions[i].op == ZB_OP_WAIT_SEND_B)
        return true;
  return false;
}

/* What zbctl plan --from-csv does next (client/plan.c), unit costs. */
static void check_pipeline(zb_schedule *s) {
  if ((long long)s->p * s->v * s->m > FUZZ_MAX_CELLS)
    return;
  if (zb_schedule_has_comm(s) && has_send_waits(s))
    zb_schedule_strip_comm(s);
  zb_rank_costs rc = zb_rank_costs_default();
  zb_costs *c = zb_costs_from_rank_share(s->p, s->v, &rc, 0);
  zb_violation viol;
  zb_diag d = {{0}};
  if (zb_validate(s, c, &viol) == ZB_OK) {
    zb_sim_result *sim = NULL;
    zb_err err = zb_simulate(s, c, &sim, &d);
    FUZZ_CHECK(err == ZB_OK, "a valid schedule does not simulate: %s", d.msg);
    zb_sim_result_free(sim);
    zb_schedule *lowered = NULL;
    if (!zb_schedule_has_comm(s)) {
      err = zb_lower(s, c, &lowered, &d);
      FUZZ_CHECK(err == ZB_OK, "a valid compute-only schedule does not lower: %s", d.msg);
      err = zb_validate(lowered, c, &viol);
      FUZZ_CHECK(err == ZB_OK, "its lowering is not valid: %s", viol.detail);
      zb_schedule_free(lowered);
    }
  }
  zb_costs_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const zb_placement placements[] = {ZB_PLACE_LOOP, ZB_PLACE_V, ZB_PLACE_INFER};
  for (int k = 0; k < 3; k++) {
    zb_schedule *s = NULL;
    zb_diag d = {{0}};
    zb_err err = zb_csv_parse((const char *)data, size, placements[k], &s, &d);
    if (err != ZB_OK) {
      FUZZ_CHECK(d.msg[0], "error %d without a message", (int)err);
      FUZZ_CHECK(!s, "a failed parse returned a schedule");
      continue;
    }
    FUZZ_CHECK(s->p >= 1 && s->v >= 1 && s->m >= 1 && s->placement != ZB_PLACE_INFER, "shape %d/%d/%d", s->p,
               s->v, s->m);
    check_round_trip(s);
    check_pipeline(s);
    zb_schedule_free(s);
  }
  return 0;
}
