/* fuzz_jobspec.c — the job-spec YAML reader (common/zb_jobspec_yaml.h),
 * what `zbctl submit` reads from a user's file. Any bytes must give ZB_OK
 * or an error with a message, never a crash, a leak or undefined
 * behaviour. A spec that parses must also survive the wire unchanged, as
 * a submission carries it: spec -> JobSpec -> bytes -> JobSpec -> spec
 * (zb_wire.h) gives back every field and passes the coordinator's check.
 * A small one then goes where the coordinator takes it: its plan
 * (zb_job_plan) succeeds or fails with a message, and every rank's
 * Assignment of a plan packs, unpacks and decodes as the worker does it.
 */
#include <string.h>

#include "fuzz.h"
#include "zb_assignment.h"
#include "zb_job_plan.h"
#include "zb_jobspec_yaml.h"
#include "zb_wire.h"

/* Plans at most this many compute ops (p x chunks x m x 3, chunks 4 for
 * zb-auto's search, as the coordinator's budget counts them), so that a
 * run stays in milliseconds. */
#define FUZZ_MAX_PLAN_OPS 600

static void check_model_equal(const zb_model_spec *a, const zb_model_spec *b) {
  FUZZ_CHECK(a->hidden == b->hidden && a->heads == b->heads && a->layers == b->layers &&
                 a->seq_len == b->seq_len && a->batch == b->batch && a->seed == b->seed,
             "model shape %d/%d/%d/%d/%d/%lld became %d/%d/%d/%d/%d/%lld", a->hidden, a->heads, a->layers,
             a->seq_len, a->batch, a->seed, b->hidden, b->heads, b->layers, b->seq_len, b->batch, b->seed);
  FUZZ_CHECK(a->lr == b->lr && a->weight_decay == b->weight_decay && a->beta1 == b->beta1 &&
                 a->beta2 == b->beta2 && a->eps == b->eps && a->clip_norm == b->clip_norm,
             "model optimizer settings changed");
  FUZZ_CHECK(strcmp(a->data, b->data) == 0 && strcmp(a->step, b->step) == 0 &&
                 strcmp(a->checkpoint_dir, b->checkpoint_dir) == 0 && strcmp(a->dump_dir, b->dump_dir) == 0 &&
                 strcmp(a->architecture, b->architecture) == 0 &&
                 strcmp(a->config_json, b->config_json) == 0 && strcmp(a->weights, b->weights) == 0,
             "model strings changed");
  FUZZ_CHECK(a->inject_nan == b->inject_nan && a->nan_iteration == b->nan_iteration &&
                 a->nan_microbatch == b->nan_microbatch && a->checkpoint_every == b->checkpoint_every &&
                 a->dump_every == b->dump_every,
             "model test hooks or checkpoints changed");
}

static void check_equal(const zb_job_spec *a, const zb_job_spec *b) {
  FUZZ_CHECK(strcmp(a->name, b->name) == 0 && strcmp(a->schedule, b->schedule) == 0 &&
                 strcmp(a->backend, b->backend) == 0 && strcmp(a->transport, b->transport) == 0 &&
                 strcmp(a->precision, b->precision) == 0,
             "strings changed ('%s' '%s' became '%s' '%s')", a->name, a->schedule, b->name, b->schedule);
  FUZZ_CHECK(a->ranks == b->ranks && a->microbatches == b->microbatches && a->chunks == b->chunks &&
                 a->iterations == b->iterations && a->trace_every == b->trace_every,
             "shape %d/%d/%d/%d/%d became %d/%d/%d/%d/%d", a->ranks, a->microbatches, a->chunks,
             a->iterations, a->trace_every, b->ranks, b->microbatches, b->chunks, b->iterations,
             b->trace_every);
  FUZZ_CHECK(a->mem_limit == b->mem_limit && a->bytes_per_activation == b->bytes_per_activation,
             "mem_limit %g bytes %lld became %g %lld", a->mem_limit, a->bytes_per_activation, b->mem_limit,
             b->bytes_per_activation);
  const zb_rank_costs *x = &a->costs, *y = &b->costs; /* == : -0 travels as 0 (proto3 drops zeros) */
  FUZZ_CHECK(x->t_f == y->t_f && x->t_b == y->t_b && x->t_w == y->t_w && x->t_comm == y->t_comm &&
                 x->m_f == y->m_f && x->m_b == y->m_b && x->m_w == y->m_w,
             "costs changed");
  FUZZ_CHECK(a->n_stage_costs == b->n_stage_costs, "%d stage_costs became %d", a->n_stage_costs,
             b->n_stage_costs);
  for (int k = 0; k < a->n_stage_costs; k++)
    FUZZ_CHECK(a->stage_costs[k][0] == b->stage_costs[k][0] && a->stage_costs[k][1] == b->stage_costs[k][1] &&
                   a->stage_costs[k][2] == b->stage_costs[k][2],
               "stage_costs[%d] changed", k);
  FUZZ_CHECK(a->adaptive.enabled == b->adaptive.enabled && a->adaptive.min_gain == b->adaptive.min_gain &&
                 a->adaptive.check_every == b->adaptive.check_every,
             "adaptive changed");
  FUZZ_CHECK(a->has_model == b->has_model || zb_job_spec_trains_model(a), "has_model changed");
  check_model_equal(&a->model, &b->model);
}

/* The spec as a submission carries it: packed, unpacked, read back. */
static void check_wire_trip(const zb_job_spec *spec) {
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(spec, &pb);
  size_t n = zb__v1__job_spec__get_packed_size(&pb);
  uint8_t *bytes = malloc(n ? n : 1);
  FUZZ_CHECK(bytes && zb__v1__job_spec__pack(&pb, bytes) == n, "packing %zu bytes", n);
  zb_wire_spec_pb_clear(&pb);
  Zb__V1__JobSpec *back = zb__v1__job_spec__unpack(NULL, n, bytes);
  FUZZ_CHECK(back, "a packed JobSpec of %zu bytes does not unpack", n);
  zb_job_spec again;
  zb_diag d = {{0}};
  zb_err err = zb_wire_spec_from_pb(back, &again, &d);
  FUZZ_CHECK(err == ZB_OK, "the spec read from YAML fails on the wire: %s", d.msg);
  check_equal(spec, &again);
  zb_job_spec_free(&again);
  zb__v1__job_spec__free_unpacked(back, NULL);
  free(bytes);
}

/* Rank r's Assignment of the plan as the worker receives it: packed in a
 * Command on the Attach stream, unpacked, decoded. */
static void check_assignment(const zb_job_spec *spec, const zb_planner_result *plan, int r) {
  static const uint8_t secret[ZB_DATA_SECRET_BYTES] = {1};
  zb_assignment_src src = {
      .job_id = "j-1", .spec = spec, .plan = plan, .plan_version = 1, .data_secret = secret};
  Zb__V1__Command cmd = ZB__V1__COMMAND__INIT;
  Zb__V1__Assignment a;
  zb_assignment_encode(&src, r, &a);
  cmd.kind_case = ZB__V1__COMMAND__KIND_ASSIGN;
  cmd.assign = &a;
  size_t n = zb__v1__command__get_packed_size(&cmd);
  uint8_t *bytes = malloc(n);
  zb__v1__command__pack(&cmd, bytes);
  zb_assignment_encode_clear(&a);
  Zb__V1__Command *back = zb__v1__command__unpack(NULL, n, bytes);
  FUZZ_CHECK(back && back->kind_case == ZB__V1__COMMAND__KIND_ASSIGN, "rank %d's Command does not unpack", r);
  zb_assignment got;
  zb_diag d = {{0}};
  zb_err err = zb_assignment_decode(back->assign, &got, &d);
  FUZZ_CHECK(err == ZB_OK, "rank %d's Assignment of a %s plan does not decode: %s", r, spec->schedule, d.msg);
  FUZZ_CHECK(got.sched->ranks[r].n == plan->lowered->ranks[r].n, "rank %d: %d actions decoded, %d planned", r,
             got.sched->ranks[r].n, plan->lowered->ranks[r].n);
  zb_assignment_free(&got);
  zb__v1__command__free_unpacked(back, NULL);
  free(bytes);
}

static void check_plan(const zb_job_spec *spec) {
  zb_family f;
  if (zb_family_parse(spec->schedule, &f, NULL) != ZB_OK)
    return;
  int v = spec->chunks > 0 ? spec->chunks : f == ZB_FAMILY_ZB_AUTO ? 4 : zb_family_default_chunks(f);
  if (3.0 * spec->ranks * v * spec->microbatches > FUZZ_MAX_PLAN_OPS)
    return;
  zb_planner_result plan = {0};
  zb_diag d = {{0}};
  zb_err err = zb_job_plan(spec, ZB_OBJ_MAKESPAN, &plan, &d);
  FUZZ_CHECK(err == ZB_OK || d.msg[0], "planning failed (%d) without a message", (int)err);
  if (err == ZB_OK) {
    FUZZ_CHECK(plan.lowered && plan.p == spec->ranks && plan.m == spec->microbatches, "plan shape %d/%d",
               plan.p, plan.m);
    for (int r = 0; r < plan.p; r++)
      check_assignment(spec, &plan, r);
  }
  zb_planner_result_free(&plan);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  zb_job_spec spec;
  zb_diag d = {{0}};
  zb_err err = zb_job_spec_parse((const char *)data, size, &spec, &d);
  FUZZ_CHECK(err == ZB_OK || d.msg[0], "error %d without a message", (int)err);
  if (err == ZB_OK) {
    check_wire_trip(&spec);
    check_plan(&spec);
    zb_job_spec_free(&spec);
  }
  return 0;
}
