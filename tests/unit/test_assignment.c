/* test_assignment.c — the Assignment codec (common/zb_assignment.h): every
 * family's plan encoded per rank, packed as a Command, unpacked and
 * decoded again (p = 1..8) equals the planner's lowered list field by field (op,
 * stage, microbatch, peer, transport group), with the rank's peers'
 * addresses and its hosted stages' costs; the older all-ranks form still
 * decodes, its action strings checked as the columns are; bad messages are refused naming the field (sizes a
 * worker would allocate from, bytes_per_activation = 2^40 or a model past the spec's limits, too); and a
 * job's total assignment bytes grow linearly with its ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_assignment.h"
#include "zb_wire.h"
#include "zbtest.h"

/* A job spec whose scalars the codec copies. */
static zb_job_spec spec_for(const char *backend) {
  zb_job_spec spec;
  zb_job_spec_default(&spec);
  snprintf(spec.backend, sizeof spec.backend, "%s", backend);
  spec.iterations = 7;
  spec.bytes_per_activation = 4096;
  return spec;
}

/* Encodes rank r of src, packs it in a Command, unpacks and decodes it. */
static zb_err round_trip(const zb_assignment_src *src, int r, zb_assignment *out, size_t *bytes, zb_diag *d) {
  Zb__V1__Assignment a;
  zb_assignment_encode(src, r, &a);
  Zb__V1__Command cmd = ZB__V1__COMMAND__INIT;
  cmd.kind_case = ZB__V1__COMMAND__KIND_ASSIGN;
  cmd.assign = &a;
  size_t n = protobuf_c_message_get_packed_size(&cmd.base);
  uint8_t *buf = zb_malloc(n);
  protobuf_c_message_pack(&cmd.base, buf);
  zb_assignment_encode_clear(&a);
  Zb__V1__Command *back =
      (Zb__V1__Command *)protobuf_c_message_unpack(&zb__v1__command__descriptor, NULL, n, buf);
  free(buf);
  *bytes = n;
  if (!back || back->kind_case != ZB__V1__COMMAND__KIND_ASSIGN)
    return zb_diag_set(d, ZB_ERR_PARSE, "the packed Command does not unpack");
  zb_err err = zb_assignment_decode(back->assign, out, d);
  protobuf_c_message_free_unpacked(&back->base, NULL);
  return err;
}

/* Field-by-field comparison of rank r's decoded list with the plan's. */
static bool same_list(const zb_rank_list *want, const zb_rank_list *got, char *why, size_t len) {
  if (want->n != got->n) {
    snprintf(why, len, "%d actions decoded, %d planned", got->n, want->n);
    return false;
  }
  for (int i = 0; i < want->n; i++) {
    const zb_action *w = &want->actions[i], *g = &got->actions[i];
    if (w->op != g->op || w->stage != g->stage || w->mb != g->mb || w->peer != g->peer ||
        w->batch != g->batch) {
      snprintf(why, len,
               "action %d: planned %s s%d mb%d peer %d group %d, decoded %s s%d mb%d peer %d group %d", i,
               zb_op_name(w->op), w->stage, w->mb, w->peer, w->batch, zb_op_name(g->op), g->stage, g->mb,
               g->peer, g->batch);
      return false;
    }
  }
  return true;
}

/* Everything rank r's decoded assignment must hold of plan pl. */
static bool check_rank(const zb_planner_result *pl, int r, const zb_assignment *a, const char *const *addrs,
                       char *why, size_t len) {
  if (a->rank != r || a->ranks != pl->p || a->chunks != pl->v || a->microbatches != pl->m ||
      a->family != pl->chosen || a->sched->placement != pl->placement || a->iterations != 7 ||
      a->bytes_per_activation != 4096) {
    /* the family the lists are of (zb-auto's choice), and so their placement */
    snprintf(why, len, "header: rank %d ranks %d chunks %d m %d %s, placement %d", a->rank, a->ranks,
             a->chunks, a->microbatches, zb_family_name(a->family), (int)a->sched->placement);
    return false;
  }
  if (!same_list(&pl->lowered->ranks[r], &a->sched->ranks[r], why, len))
    return false;
  const zb_rank_list *l = &a->sched->ranks[r];
  for (int i = 0; i < l->n; i++) /* every peer it talks to has its address */
    if (zb_op_is_comm(l->actions[i].op) &&
        (!zb_assignment_peer(a, l->actions[i].peer) ||
         strcmp(zb_assignment_peer(a, l->actions[i].peer), addrs[l->actions[i].peer]) != 0)) {
      snprintf(why, len, "no or wrong address for peer %d", l->actions[i].peer);
      return false;
    }
  for (int s = 0; s < pl->costs->n_stages; s++) {
    bool hosted = zb_placement_rank(pl->placement, pl->p, pl->v, s) == r;
    double want_tf = hosted ? pl->costs->t_f[s] : 0, want_mb = hosted ? pl->costs->m_b[s] : 0;
    double want_tr = hosted ? pl->costs->t_reduce[s] : 0;
    if (a->costs->t_f[s] != want_tf || a->costs->m_b[s] != want_mb || a->costs->t_reduce[s] != want_tr) {
      snprintf(why, len, "stage %d (%s): t_f %g m_b %g t_reduce %g", s, hosted ? "hosted" : "not hosted",
               a->costs->t_f[s], a->costs->m_b[s], a->costs->t_reduce[s]);
      return false;
    }
  }
  return true;
}

/* T_reduce of the plans plan_shape makes (0: no REDUCE_GRAD actions). */
static double g_t_reduce;

static bool plan_shape(zb_family f, int p, int v, int m, zb_planner_result *pl) {
  if (zb_plan_check_shape(f, p, v > 0 ? v : zb_family_default_chunks(f), m, NULL) != ZB_OK)
    return false;
  zb_rank_costs rc = {.t_f = 1, .t_b = 1.25, .t_w = 0.75, .t_comm = 0.05, .m_f = 1, .m_b = -0.4, .m_w = -0.6};
  rc.t_reduce = g_t_reduce;
  zb_planner_request req = {.family = f, .p = p, .v = v, .m = m, .rank = rc};
  zb_diag d;
  if (zb_planner_run(&req, pl, &d) != ZB_OK) {
    fprintf(stderr, "  %s p=%d v=%d m=%d: %s\n", zb_family_name(f), p, v, m, d.msg);
    zb_planner_result_free(pl);
    return false;
  }
  return true;
}

/* Round-trips every rank of one shape; returns the number of groups seen. */
static int round_trip_shape(zb_family f, int p, int v, int m, int *failures) {
  zb_planner_result pl;
  if (!plan_shape(f, p, v, m, &pl))
    return 0;
  zb_job_spec spec = spec_for("sim");
  char **addrs = zb_calloc((size_t)p, sizeof(char *));
  for (int r = 0; r < p; r++) {
    addrs[r] = zb_malloc(32);
    snprintf(addrs[r], 32, "10.0.%d.%d:%d", r / 200, r % 200, 7000 + r);
  }
  zb_assignment_src src = {.job_id = "j-42",
                           .spec = &spec,
                           .plan = &pl,
                           .addresses = (const char *const *)addrs,
                           .plan_version = 1};
  int groups = 0;
  for (int r = 0; r < p; r++) {
    zb_assignment a;
    zb_diag d = {{0}};
    size_t bytes;
    char why[300] = "";
    zb_err err = round_trip(&src, r, &a, &bytes, &d);
    if (err || !check_rank(&pl, r, &a, (const char *const *)addrs, why, sizeof why)) {
      fprintf(stderr, "  %s p=%d v=%d m=%d rank %d: %s\n", zb_family_name(f), p, pl.v, m, r,
              err ? d.msg : why);
      (*failures)++;
    } else {
      groups += zb_comm_group_count(a.sched->ranks[r].actions, a.sched->ranks[r].n);
    }
    zb_assignment_free(&a);
  }
  for (int r = 0; r < p; r++)
    free(addrs[r]);
  free(addrs);
  zb_planner_result_free(&pl);
  return groups;
}

static void test_round_trip_every_family(void) {
  int failures = 0, shapes = 0, groups = 0, multi = 0;
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
    for (int p = 1; p <= 8; p++) {
      bool inter = f == ZB_FAMILY_INTERLEAVED_1F1B;
      int ms[] = {p, 2 * p, 3 * p + 1};
      for (int v = inter ? 2 : 0; v <= (inter ? 4 : 0); v++)
        for (int k = 0; k < 3; k++) {
          int m = inter ? ms[k] - ms[k] % p : ms[k];
          int g = round_trip_shape((zb_family)f, p, v, m, &failures);
          shapes += g > 0;
          groups += g;
        }
    }
  /* the grouping is really exercised: some lists hold groups of two or more */
  for (int p = 2; p <= 8; p++) {
    zb_planner_result pl;
    if (!plan_shape(ZB_FAMILY_ZB_V, p, 0, 2 * p, &pl))
      continue;
    for (int r = 0; r < p; r++) {
      const zb_rank_list *l = &pl.lowered->ranks[r];
      for (int i = 0; i < l->n; i++)
        multi += l->actions[i].batch;
    }
    zb_planner_result_free(&pl);
  }
  printf("  %d shapes round-tripped, %d transport groups, %d batched actions in zb-v\n", shapes, groups,
         multi);
  CHECK_EQ(failures, 0);
  CHECK(shapes > 150);
  CHECK(multi > 0);
}

/* Lists with the gradient reduction (data_parallel > 1) carry their
 * REDUCE_GRAD and WAIT_REDUCE_GRAD actions and each stage's T_reduce
 * through the wire unchanged (check_rank compares both). */
static void test_round_trip_reduce(void) {
  g_t_reduce = 0.5;
  int failures = 0, shapes = 0, reduces = 0;
  zb_family fams[] = {ZB_FAMILY_1F1B, ZB_FAMILY_ZB_H1, ZB_FAMILY_ZB_V};
  for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++)
    for (int p = 1; p <= 4; p++) {
      shapes += round_trip_shape(fams[f], p, 0, 2 * p, &failures) > 0 || p == 1;
      zb_planner_result pl;
      if (!plan_shape(fams[f], p, 0, 2 * p, &pl))
        continue;
      for (int r = 0; r < p; r++)
        for (int i = 0; i < pl.lowered->ranks[r].n; i++)
          reduces += pl.lowered->ranks[r].actions[i].op == ZB_OP_REDUCE_GRAD;
      zb_planner_result_free(&pl);
    }
  g_t_reduce = 0;
  printf("  %d shapes with reductions round-tripped, %d REDUCE_GRAD actions\n", shapes, reduces);
  CHECK_EQ(failures, 0);
  CHECK(reduces >= 3 * (1 + 2 + 3 + 4)); /* one per hosted stage at least */
}

/* The older all-ranks form of rank r of pl around the action strings ra:
 * every rank's address and every stage's costs, in t (old_form_free). */
typedef struct old_form {
  Zb__V1__Assignment a;
  Zb__V1__StageCosts *sc, **scp;
  double *mf;
} old_form;

static char *old_addrs[4] = {"a:1", "b:2", "c:3", "d:4"};

static void old_form_make(const zb_planner_result *pl, int r, Zb__V1__RankActions *ra, old_form *t) {
  int S = pl->p * pl->v;
  t->sc = zb_calloc((size_t)S, sizeof *t->sc);
  t->scp = zb_calloc((size_t)S, sizeof *t->scp);
  t->mf = zb_calloc((size_t)S * 3, sizeof(double));
  for (int s = 0; s < S; s++) {
    zb__v1__stage_costs__init(&t->sc[s]);
    t->sc[s].t_f = pl->costs->t_f[s];
    t->scp[s] = &t->sc[s];
    t->mf[s] = pl->costs->m_f[s];
    t->mf[S + s] = pl->costs->m_b[s];
    t->mf[2 * S + s] = pl->costs->m_w[s];
  }
  Zb__V1__Assignment *a = &t->a;
  zb__v1__assignment__init(a);
  a->job_id = "j-1";
  a->rank = r;
  a->ranks = pl->p;
  a->microbatches = pl->m;
  a->iterations = 3;
  a->schedule = (char *)zb_family_name(pl->family);
  a->backend = "sim";
  a->transport = "tcp";
  a->n_peer_addresses = 4;
  a->peer_addresses = old_addrs;
  a->actions = ra;
  a->n_stage_seconds = a->n_stage_m_f = a->n_stage_m_b = a->n_stage_m_w = (size_t)S;
  a->stage_seconds = t->scp;
  a->stage_m_f = t->mf;
  a->stage_m_b = t->mf + S;
  a->stage_m_w = t->mf + 2 * S;
}

static void old_form_free(old_form *t) {
  free(t->sc);
  free(t->scp);
  free(t->mf);
}

/* The older form (action strings, every rank's address, every stage's
 * costs) still decodes; its comm actions are groups of one. */
static void test_old_form_decodes(void) {
  zb_planner_result pl;
  CHECK(plan_shape(ZB_FAMILY_ZB_H1, 4, 0, 8, &pl));
  int r = 1;
  Zb__V1__RankActions ra;
  zb_wire_rank_actions(pl.lowered, r, &ra);
  old_form t;
  old_form_make(&pl, r, &ra, &t);
  zb_assignment got;
  zb_diag d = {{0}};
  zb_err err = zb_assignment_decode(&t.a, &got, &d);
  CHECK_MSG(err == ZB_OK, "%s", d.msg);
  const zb_rank_list *want = &pl.lowered->ranks[r], *l = &got.sched->ranks[r];
  CHECK_EQ(l->n, want->n);
  for (int i = 0; i < l->n && i < want->n; i++) {
    CHECK_EQ(l->actions[i].op, want->actions[i].op);
    CHECK_EQ(l->actions[i].peer, want->actions[i].peer);
    CHECK(!l->actions[i].batch);
  }
  CHECK_EQ(got.chunks, 1);
  CHECK_STREQ(got.precision, "fp32"); /* a coordinator older than the field */
  CHECK_STREQ(zb_assignment_peer(&got, 3), "d:4");
  CHECK_NEAR(got.costs->m_b[2], pl.costs->m_b[2], 0);
  zb_assignment_free(&got);
  zb_wire_rank_actions_clear(&ra);
  old_form_free(&t);
  zb_planner_result_free(&pl);
}

/* The older form's action strings are checked as the columns are: a
 * compute or comm kind, a stage and microbatch of the plan, and for comm
 * a partner stage on another rank. fuzz_proto found them unchecked: a
 * RECV_F of stage 0 decoded with peer -1, a stage past the plan's would
 * index the worker's cost tables out of bounds. */
static void test_old_form_bad_actions_refused(void) {
  static const struct {
    const char *action, *expect;
  } cases[] = {
      {"0RECV_F0", "assignment.actions[1]: peer -1 for RECV_F on rank 1 of 4"},
      {"4F0", "assignment.actions[1]: stage 4 is not one of 4"},
      {"1F8", "assignment.actions[1]: microbatch 8 is not one of 8"},
      {"1UNSHARD", "assignment.actions[1]: UNSHARD is not a compute, comm or reduction action"},
      {"1WAIT_SEND_F0", "assignment.actions[1]: WAIT_SEND_F is not a compute, comm or reduction action"},
      {"4REDUCE_GRAD", "assignment.actions[1]: stage 4 is not one of 4"},
  };
  zb_planner_result pl;
  CHECK(plan_shape(ZB_FAMILY_1F1B, 4, 0, 8, &pl));
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    char *actions[2] = {"1F0", (char *)cases[k].action};
    Zb__V1__RankActions ra = ZB__V1__RANK_ACTIONS__INIT;
    ra.rank = 1;
    ra.n_actions = 2;
    ra.actions = actions;
    old_form t;
    old_form_make(&pl, 1, &ra, &t);
    zb_assignment got;
    zb_diag d = {{0}};
    zb_err err = zb_assignment_decode(&t.a, &got, &d);
    zb_assignment_free(&got);
    old_form_free(&t);
    CHECK_MSG(err == ZB_ERR_INVALID_ARG && strstr(d.msg, cases[k].expect), "%s: err %d, '%s' (expected '%s')",
              cases[k].action, (int)err, d.msg, cases[k].expect);
  }
  zb_planner_result_free(&pl);
}

/* A valid encoded Assignment to break, field by field. */
typedef struct bad_case {
  const char *name, *expect;
  void (*breakit)(Zb__V1__Assignment *a);
} bad_case;

static void b_precision(Zb__V1__Assignment *a) {
  a->precision = "fp8";
}
static void b_columns(Zb__V1__Assignment *a) {
  a->action_list->n_peer--;
}
static void b_kind(Zb__V1__Assignment *a) {
  a->action_list->kind[0] = (Zb__V1__ActionKind)42;
}
static void b_stage(Zb__V1__Assignment *a) {
  a->action_list->stage[0] = 99;
}
static void b_mb(Zb__V1__Assignment *a) {
  a->action_list->microbatch[0] = 8;
}
static void b_reduce_mb(Zb__V1__Assignment *a) { /* rank 0's first action, an F of microbatch 0 */
  a->action_list->kind[0] = ZB__V1__ACTION_KIND__ACTION_KIND_REDUCE_GRAD;
}
static void b_reduce_time(Zb__V1__Assignment *a) {
  a->stages[0]->t_reduce = -1;
}
static void b_group(Zb__V1__Assignment *a) {
  a->action_list->group_with_next[0] = 1; /* rank 0 starts with an F */
}
static void b_peer_self(Zb__V1__Assignment *a) {
  for (size_t i = 0; i < a->action_list->n_kind; i++)
    if (a->action_list->peer[i] >= 0) {
      a->action_list->peer[i] = a->rank;
      return;
    }
}
/* a peer past 16 bits must not wrap around to a rank of the job */
static void b_peer_wide(Zb__V1__Assignment *a) {
  for (size_t i = 0; i < a->action_list->n_kind; i++)
    if (a->action_list->peer[i] >= 0) {
      a->action_list->peer[i] += 65536;
      return;
    }
}
/* stage and microbatch a multiple of 2^18 and 2^24 past a good one: cut to
 * an action's bits, they would be that good one again */
static void b_stage_wide(Zb__V1__Assignment *a) {
  a->action_list->stage[0] += 1 << 18;
}
static void b_mb_wide(Zb__V1__Assignment *a) {
  a->action_list->microbatch[0] += 1 << 24;
}
static void b_rank(Zb__V1__Assignment *a) {
  a->rank = 4;
}
static void b_chunks(Zb__V1__Assignment *a) {
  a->chunks = 1 << 30;
}
static void b_schedule(Zb__V1__Assignment *a) {
  a->schedule = "zb-h9";
}
static void b_peer_rank(Zb__V1__Assignment *a) {
  a->peers[0]->rank = -3;
}
static void b_stage_costs(Zb__V1__Assignment *a) {
  a->stages[0]->stage = 40;
}
static void b_no_list(Zb__V1__Assignment *a) {
  a->action_list = NULL;
}
/* a hostile coordinator's sizes: the worker would allocate them */
static void b_bytes(Zb__V1__Assignment *a) {
  a->bytes_per_activation = 1LL << 40;
}
static void b_iterations(Zb__V1__Assignment *a) {
  a->iterations = 2000000000;
}
static void b_trace_every(Zb__V1__Assignment *a) {
  a->trace_every = 1 << 30;
}
static void b_transfer_timeout(Zb__V1__Assignment *a) {
  a->transfer_timeout_s = 86401;
}
static void b_first_iteration(Zb__V1__Assignment *a) {
  a->first_iteration = a->iterations + 1;
}

static void test_bad_assignments_refused(void) {
  static const bad_case cases[] = {
      {"columns", "columns of unequal length", b_columns},
      {"kind", "action_list[0]: unknown kind 42", b_kind},
      {"stage", "action_list[0]: stage 99", b_stage},
      {"microbatch", "action_list[0]: microbatch 8", b_mb},
      {"group", "cannot open a group", b_group},
      {"reduce microbatch", "action_list[0]: REDUCE_GRAD takes microbatch -1 and peer -1 (got 0, -1)",
       b_reduce_mb},
      {"reduce time", "assignment.stages[0]: t_reduce -1 is not a time", b_reduce_time},
      {"peer self", "peer 0 for", b_peer_self},
      {"peer wide", "action_list[1]: peer 65537 is not one of 4 ranks", b_peer_wide},
      {"stage wide", "action_list[0]: stage 262144 is not one of 4", b_stage_wide},
      {"microbatch wide", "action_list[0]: microbatch 16777216 is not one of 8", b_mb_wide},
      {"rank", "assignment.rank", b_rank},
      {"chunks", "assignment.chunks", b_chunks},
      {"schedule", "zb-h9", b_schedule},
      {"peers", "assignment.peers[0]", b_peer_rank},
      {"stages", "assignment.stages[0]: stage 40", b_stage_costs},
      {"no list", "assignment.action_list: required", b_no_list},
      {"precision", "assignment.precision: 'fp8'", b_precision},
      {"bytes_per_activation 2^40", "assignment.bytes_per_activation: 1099511627776 is outside 0..1073741824",
       b_bytes},
      {"iterations", "assignment.iterations: 2000000000", b_iterations},
      {"trace_every", "assignment.trace_every: 1073741824", b_trace_every},
      {"transfer_timeout_s", "assignment.transfer_timeout_s: 86401", b_transfer_timeout},
      {"first_iteration", "assignment.first_iteration: 8", b_first_iteration},
  };
  zb_planner_result pl;
  CHECK(plan_shape(ZB_FAMILY_1F1B, 4, 0, 8, &pl));
  zb_job_spec spec = spec_for("sim");
  zb_assignment_src src = {.job_id = "j-9", .spec = &spec, .plan = &pl, .plan_version = 1};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    Zb__V1__Assignment a;
    zb_assignment_encode(&src, 0, &a);
    Zb__V1__ActionList *keep = a.action_list;
    cases[k].breakit(&a);
    zb_assignment got;
    zb_diag d = {{0}};
    zb_err err = zb_assignment_decode(&a, &got, &d);
    zb_assignment_free(&got);
    a.action_list = keep;
    if (keep)
      keep->n_peer = keep->n_kind;
    zb_assignment_encode_clear(&a);
    CHECK_MSG(err != ZB_OK && strstr(d.msg, cases[k].expect), "%s: err %d, '%s' (expected '%s')",
              cases[k].name, (int)err, d.msg, cases[k].expect);
  }
  zb_planner_result_free(&pl);
}

/* A cpu job's model is held to the job spec's size checks: a worker sizes
 * its tensors and buffers from it. */
static void test_model_sizes_refused(void) {
  zb_planner_result pl;
  CHECK(plan_shape(ZB_FAMILY_1F1B, 2, 0, 4, &pl));
  zb_job_spec spec = spec_for("cpu");
  spec.model.layers = 2; /* what the coordinator derives, one per stage */
  zb_assignment_src src = {.job_id = "j-3", .spec = &spec, .plan = &pl, .plan_version = 1};
  static const struct {
    int hidden, heads, seq_len, batch;
    const char *expect;
  } cases[] = {
      {1 << 20, 4, 8, 1, "assignment.model.hidden"},
      {64, 3, 8, 1, "assignment.model.heads: must divide model.hidden (64)"},
      {65536, 4, 4096, 64, "assignment.model: too large"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    Zb__V1__Assignment a;
    zb_assignment_encode(&src, 1, &a);
    CHECK(a.model != NULL);
    a.model->hidden = cases[k].hidden;
    a.model->heads = cases[k].heads;
    a.model->seq_len = cases[k].seq_len;
    a.model->batch = cases[k].batch;
    zb_assignment got;
    zb_diag d = {{0}};
    zb_err err = zb_assignment_decode(&a, &got, &d);
    zb_assignment_free(&got);
    zb_assignment_encode_clear(&a);
    CHECK_MSG(err == ZB_ERR_INVALID_ARG && strstr(d.msg, cases[k].expect), "case %zu: err %d, '%s'", k,
              (int)err, d.msg);
  }
  Zb__V1__Assignment a; /* and the model as encoded decodes */
  zb_assignment_encode(&src, 1, &a);
  zb_assignment got;
  zb_diag d = {{0}};
  CHECK_MSG(zb_assignment_decode(&a, &got, &d) == ZB_OK, "%s", d.msg);
  zb_assignment_free(&got);
  zb_assignment_encode_clear(&a);
  zb_planner_result_free(&pl);
}

/* A cuda job's Assignment carries what the cpu job's does (the resolved
 * model) plus its transport and precision, through a packed Command. */
static void test_cuda_job_fields(void) {
  zb_planner_result pl;
  CHECK(plan_shape(ZB_FAMILY_ZB_V, 2, 0, 4, &pl));
  const char *precisions[] = {"fp32", "tf32", "bf16"};
  for (int k = 0; k < 3; k++) {
    zb_job_spec spec = spec_for("cuda");
    snprintf(spec.transport, sizeof spec.transport, "nccl");
    snprintf(spec.precision, sizeof spec.precision, "%s", precisions[k]);
    spec.ranks = 2;
    spec.microbatches = 4;
    snprintf(spec.schedule, sizeof spec.schedule, "zb-v");
    snprintf(spec.name, sizeof spec.name, "gpu");
    spec.model.hidden = 32;
    spec.model.batch = 3 + k;
    zb_job_spec_derive(&spec, false);
    zb_diag d = {{0}};
    CHECK_MSG(zb_job_spec_check(&spec, &d) == ZB_OK, "%s", d.msg);
    zb_assignment_src src = {.job_id = "j-5", .spec = &spec, .plan = &pl, .plan_version = 1};
    zb_assignment a;
    size_t bytes;
    zb_err err = round_trip(&src, 1, &a, &bytes, &d);
    CHECK_MSG(err == ZB_OK, "%s", d.msg);
    CHECK_STREQ(a.backend, "cuda");
    CHECK_STREQ(a.transport, "nccl");
    CHECK_STREQ(a.precision, precisions[k]);
    CHECK(a.has_model);
    CHECK_EQ(a.model.hidden, 32);
    CHECK_EQ(a.model.batch, 3 + k);
    CHECK_EQ(a.model.layers, 4); /* ranks x chunks, resolved at the coordinator */
    /* 4 bytes an element, 2 under bf16 (the ranks send bf16 activations) */
    CHECK_EQ(a.bytes_per_activation, (long long)(3 + k) * 64 * 32 * (k == 2 ? 2 : 4));
    zb_assignment_free(&a);
    zb_job_spec_free(&spec);
  }
  /* a sim job carries no model, and fp32 */
  zb_job_spec spec = spec_for("sim");
  zb_assignment_src src = {.job_id = "j-6", .spec = &spec, .plan = &pl, .plan_version = 1};
  zb_assignment a;
  size_t bytes;
  zb_diag d = {{0}};
  CHECK_EQ(round_trip(&src, 0, &a, &bytes, &d), ZB_OK);
  CHECK(!a.has_model);
  CHECK_STREQ(a.precision, "fp32");
  zb_assignment_free(&a);
  zb_planner_result_free(&pl);
}

/* Total and largest wire bytes of a job's assignments at p ranks. */
static void sizes_at(zb_family f, int p, int m, zb_assignment_sizes *sz) {
  zb_planner_result pl;
  memset(sz, 0, sizeof *sz);
  if (!plan_shape(f, p, 0, m, &pl))
    return;
  zb_job_spec spec = spec_for("cpu"); /* a cpu job also carries its model */
  const char **addrs = zb_calloc((size_t)p, sizeof(char *));
  for (int r = 0; r < p; r++)
    addrs[r] = "worker-with-a-long-host-name.cluster.example:40123";
  zb_assignment_src src = {
      .job_id = "j-1", .spec = &spec, .plan = &pl, .addresses = addrs, .plan_version = 1};
  zb_assignment_measure(&src, sz);
  free(addrs);
  zb_planner_result_free(&pl);
}

/* Each rank receives only what it needs: at a fixed m the total grows
 * linearly with p (it grew as p^2 when every rank carried every rank's
 * address and every stage's costs). */
static void test_bytes_linear_in_ranks(void) {
  const int ps[] = {250, 500, 1000};
  const zb_family fams[] = {ZB_FAMILY_1F1B, ZB_FAMILY_ZB_H1};
  for (int k = 0; k < 2; k++) {
    zb_assignment_sizes sz[3];
    for (int i = 0; i < 3; i++) {
      sizes_at(fams[k], ps[i], 16, &sz[i]);
      printf("  %s p=%4d m=16: total %9zu bytes (%.1f per rank), largest %zu (rank %d)\n",
             zb_family_name(fams[k]), ps[i], sz[i].total, (double)sz[i].total / ps[i], sz[i].largest,
             sz[i].largest_rank);
      CHECK(sz[i].total > 0);
    }
    /* quadratic growth would be x4 and x16; rank and stage numbers past 127
     * take a second varint byte, so the first 250 ranks are a little
     * cheaper: the increments are what must be proportional */
    double r2 = (double)sz[1].total / (double)sz[0].total, r4 = (double)sz[2].total / (double)sz[0].total;
    double inc = (double)(sz[2].total - sz[1].total) / (double)(sz[1].total - sz[0].total);
    CHECK_MSG(r2 < 2.2 && r4 < 4.4 && inc > 1.98 && inc < 2.02,
              "%s: total x%.3f at 2p, x%.3f at 4p, increments x%.3f", zb_family_name(fams[k]), r2, r4, inc);
    CHECK(sz[2].largest < sz[0].largest + 64); /* a rank's own share does not grow with p */
  }
}

ZBT_MAIN(ZBT(test_round_trip_every_family), ZBT(test_old_form_decodes), ZBT(test_round_trip_reduce),
         ZBT(test_old_form_bad_actions_refused), ZBT(test_bad_assignments_refused),
         ZBT(test_model_sizes_refused), ZBT(test_cuda_job_fields), ZBT(test_bytes_linear_in_ranks))
