#include "zb_wire.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_assignment.h"
#include "zb_format.h"
#include "zb_job_state.h"

zb_err zb_wire_copy_str(char *dst, size_t cap, const char *src, const char *field, zb_diag *diag) {
  if (!src)
    src = "";
  if (strlen(src) >= cap)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s: longer than %zu characters", field, cap - 1);
  snprintf(dst, cap, "%s", src);
  return ZB_OK;
}

/* The architecture fields. With gpt2 or llama the config gives hidden,
 * heads and layers: those absent (0) stay 0 for zb_job_spec_derive, not
 * the builtin's defaults. */
static zb_err wire_model_arch_from_pb(const Zb__V1__ModelSpec *pb, zb_model_spec *out, zb_diag *diag) {
  zb_err err;
  if ((pb->architecture && pb->architecture[0] &&
       (err = zb_wire_copy_str(out->architecture, sizeof out->architecture, pb->architecture,
                               "model.architecture", diag))) ||
      (err = zb_wire_copy_str(out->config_json, sizeof out->config_json, pb->config_json, "model.config",
                              diag)) ||
      (err = zb_wire_copy_str(out->weights, sizeof out->weights, pb->weights, "model.weights", diag)) ||
      (pb->order && pb->order[0] &&
       (err = zb_wire_copy_str(out->order, sizeof out->order, pb->order, "model.order", diag))))
    return err;
  if (zb_model_spec_has_arch(out)) {
    out->hidden = pb->hidden;
    out->heads = pb->heads;
    out->layers = pb->layers;
  }
  return ZB_OK;
}

zb_err zb_wire_model_from_pb(const Zb__V1__ModelSpec *pb, zb_model_spec *out, zb_diag *diag) {
  if (pb->hidden != 0)
    out->hidden = pb->hidden;
  if (pb->heads != 0)
    out->heads = pb->heads;
  if (pb->layers != 0)
    out->layers = pb->layers;
  if (pb->seq_len != 0)
    out->seq_len = pb->seq_len;
  if (pb->batch != 0)
    out->batch = pb->batch;
  if (pb->seed > (uint64_t)LLONG_MAX)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model.seed: must be between 1 and %lld, got %llu",
                       LLONG_MAX, (unsigned long long)pb->seed);
  if (pb->seed != 0)
    out->seed = (long long)pb->seed;
  zb_err err;
  if (pb->data && pb->data[0] &&
      (err = zb_wire_copy_str(out->data, sizeof out->data, pb->data, "model.data", diag)))
    return err;
  if (pb->lr != 0)
    out->lr = pb->lr;
  if (pb->weight_decay)
    out->weight_decay = pb->weight_decay->value;
  if (pb->beta1)
    out->beta1 = pb->beta1->value;
  if (pb->beta2)
    out->beta2 = pb->beta2->value;
  if (pb->eps != 0)
    out->eps = pb->eps;
  if (pb->clip_norm)
    out->clip_norm = pb->clip_norm->value;
  if (pb->step && pb->step[0] &&
      (err = zb_wire_copy_str(out->step, sizeof out->step, pb->step, "model.step", diag)))
    return err;
  if (pb->inject_nan) {
    out->inject_nan = true;
    out->nan_iteration = pb->inject_nan->iteration;
    out->nan_microbatch = pb->inject_nan->microbatch;
  }
  out->checkpoint_every = pb->checkpoint_every;
  if (pb->checkpoint_dir && pb->checkpoint_dir[0] &&
      (err = zb_wire_copy_str(out->checkpoint_dir, sizeof out->checkpoint_dir, pb->checkpoint_dir,
                              "model.checkpoint_dir", diag)))
    return err;
  if (pb->dump_dir && pb->dump_dir[0] &&
      (err = zb_wire_copy_str(out->dump_dir, sizeof out->dump_dir, pb->dump_dir, "model.dump_dir", diag)))
    return err;
  out->dump_every = pb->dump_every;
  if (pb->resume_from_job_id && pb->resume_from_job_id[0] &&
      (err = zb_wire_copy_str(out->resume_from, sizeof out->resume_from, pb->resume_from_job_id,
                              "model.resume_from_job_id", diag)))
    return err;
  return wire_model_arch_from_pb(pb, out, diag);
}

void zb_wire_model_to_pb(const zb_model_spec *m, zb_wire_model_pb *out) {
  Zb__V1__ModelSpec *pb = &out->m;
  Zb__V1__DoubleValue *dv = out->dv;
  zb__v1__model_spec__init(pb);
  pb->hidden = m->hidden;
  pb->heads = m->heads;
  pb->layers = m->layers;
  pb->seq_len = m->seq_len;
  pb->batch = m->batch;
  pb->seed = (uint64_t)m->seed;
  pb->data = (char *)m->data;
  pb->lr = m->lr;
  pb->eps = m->eps;
  const double given[4] = {m->weight_decay, m->beta1, m->beta2, m->clip_norm};
  for (int k = 0; k < 4; k++) {
    zb__v1__double_value__init(&dv[k]);
    dv[k].value = given[k];
  }
  pb->weight_decay = &dv[0];
  pb->beta1 = &dv[1];
  pb->beta2 = &dv[2];
  pb->clip_norm = &dv[3];
  pb->step = (char *)m->step;
  if (m->inject_nan) {
    zb__v1__nan_injection__init(&out->nan);
    out->nan.iteration = m->nan_iteration;
    out->nan.microbatch = m->nan_microbatch;
    pb->inject_nan = &out->nan;
  }
  pb->checkpoint_every = m->checkpoint_every;
  pb->checkpoint_dir = (char *)m->checkpoint_dir;
  pb->resume_from_job_id = (char *)m->resume_from;
  pb->dump_dir = (char *)m->dump_dir;
  pb->dump_every = m->dump_every;
  pb->architecture = (char *)m->architecture;
  pb->config_json = (char *)m->config_json;
  pb->weights = (char *)m->weights;
  pb->order = (char *)m->order;
}

/* RankCosts over the defaults: absent keeps them all. */
static void wire_costs_from_pb(const Zb__V1__RankCosts *c, zb_rank_costs *out) {
  if (!c)
    return;
  out->t_f = c->t_f;
  out->t_b = c->t_b;
  out->t_w = c->t_w;
  out->t_comm = c->t_comm;
  out->t_reduce = c->t_reduce;
  if (c->m_f != 0 || c->m_b != 0 || c->m_w != 0) { /* all-zero deltas mean "default memory" */
    out->m_f = c->m_f;
    out->m_b = c->m_b;
    out->m_w = c->m_w;
  }
}

/* The data-parallel fields, zero meaning the default (zb.proto). */
static zb_err wire_dp_from_pb(const Zb__V1__JobSpec *pb, zb_job_spec *out, zb_diag *diag) {
  if (pb->data_parallel != 0)
    out->data_parallel = pb->data_parallel;
  out->zero = pb->zero;
  if (pb->link_gbps != 0)
    out->link_gbps = pb->link_gbps;
  if (pb->link_latency_us)
    out->link_latency_us = pb->link_latency_us->value;
  zb_err err;
  if (pb->torch_run && pb->torch_run[0] &&
      (err = zb_wire_copy_str(out->torch_run, sizeof out->torch_run, pb->torch_run, "torch_run", diag)))
    return err;
  if (pb->rank_order && pb->rank_order[0])
    return zb_wire_copy_str(out->rank_order, sizeof out->rank_order, pb->rank_order, "rank_order", diag);
  return ZB_OK;
}

zb_err zb_wire_spec_from_pb(const Zb__V1__JobSpec *pb, zb_job_spec *out, zb_diag *diag) {
  zb_job_spec_default(out);
  zb_err err;
  if ((err = zb_wire_copy_str(out->name, sizeof out->name, pb->name, "name", diag)) ||
      (err = zb_wire_copy_str(out->owner, sizeof out->owner, pb->owner, "owner", diag)) ||
      (err = zb_wire_copy_str(out->schedule, sizeof out->schedule, pb->schedule, "schedule", diag)))
    return err;
  out->ranks = pb->ranks;
  out->microbatches = pb->microbatches;
  out->chunks = pb->chunks;
  out->mem_limit = pb->mem_limit;
  wire_costs_from_pb(pb->costs, &out->costs);
  if (pb->n_stage_costs > 0) {
    out->n_stage_costs = (int)pb->n_stage_costs;
    out->stage_costs = zb_malloc(sizeof *out->stage_costs * pb->n_stage_costs);
    for (size_t k = 0; k < pb->n_stage_costs; k++) {
      out->stage_costs[k][0] = pb->stage_costs[k]->t_f;
      out->stage_costs[k][1] = pb->stage_costs[k]->t_b;
      out->stage_costs[k][2] = pb->stage_costs[k]->t_w;
    }
  }
  if (pb->iterations != 0)
    out->iterations = pb->iterations;
  if (pb->backend && pb->backend[0] &&
      (err = zb_wire_copy_str(out->backend, sizeof out->backend, pb->backend, "backend", diag)))
    goto fail;
  if (pb->transport && pb->transport[0] &&
      (err = zb_wire_copy_str(out->transport, sizeof out->transport, pb->transport, "transport", diag)))
    goto fail;
  if (pb->precision && pb->precision[0] &&
      (err = zb_wire_copy_str(out->precision, sizeof out->precision, pb->precision, "precision", diag)))
    goto fail;
  if (pb->bytes_per_activation != 0)
    out->bytes_per_activation = pb->bytes_per_activation;
  /* proto: 0 is the default, -1 none; the checker refuses other negatives */
  if (pb->trace_every != 0)
    out->trace_every = pb->trace_every == -1 ? 0 : pb->trace_every;
  if (pb->transfer_timeout_s != 0)
    out->transfer_timeout_s = pb->transfer_timeout_s;
  if (pb->wait_for_workers_s != 0)
    out->wait_for_workers_s = pb->wait_for_workers_s == -1 ? 0 : pb->wait_for_workers_s;
  if ((err = wire_dp_from_pb(pb, out, diag)))
    goto fail;
  if (pb->adaptive) {
    Zb__V1__AdaptiveMode mode = pb->adaptive->mode;
    out->adaptive.enabled = mode == ZB__V1__ADAPTIVE_MODE__ADAPTIVE_MODE_ON    ? 1
                            : mode == ZB__V1__ADAPTIVE_MODE__ADAPTIVE_MODE_OFF ? 0
                            : mode == ZB__V1__ADAPTIVE_MODE__ADAPTIVE_MODE_DEFAULT
                                ? -1
                                : -2; /* unknown: the checker names it */
    if (pb->adaptive->min_gain)
      out->adaptive.min_gain = pb->adaptive->min_gain->value;
    if (pb->adaptive->check_every != 0)
      out->adaptive.check_every = pb->adaptive->check_every;
  }
  if (pb->model) {
    out->has_model = true;
    if ((err = zb_wire_model_from_pb(pb->model, &out->model, diag)))
      goto fail;
  }
  zb_job_spec_derive(out, pb->bytes_per_activation != 0);
  if ((err = zb_job_spec_check(out, diag)))
    goto fail;
  return ZB_OK;
fail:
  zb_job_spec_free(out);
  return err;
}

/* AdaptiveSpec and its min_gain in one block, the message first, so that
 * zb_wire_spec_pb_clear frees both by pb->adaptive. */
typedef struct zb_wire_adaptive_pb {
  Zb__V1__AdaptiveSpec m;
  Zb__V1__DoubleValue min_gain;
} zb_wire_adaptive_pb;

/* RankCosts and the link latency in one block, the costs first, so that
 * zb_wire_spec_pb_clear frees both by pb->costs. */
typedef struct zb_wire_costs_pb {
  Zb__V1__RankCosts m;
  Zb__V1__DoubleValue latency;
} zb_wire_costs_pb;

void zb_wire_spec_to_pb(const zb_job_spec *spec, Zb__V1__JobSpec *pb) {
  zb__v1__job_spec__init(pb);
  pb->name = (char *)spec->name;
  pb->owner = (char *)spec->owner;
  pb->ranks = spec->ranks;
  pb->microbatches = spec->microbatches;
  pb->schedule = (char *)spec->schedule;
  pb->chunks = spec->chunks;
  pb->mem_limit = spec->mem_limit;
  zb_wire_costs_pb *cb = zb_malloc(sizeof *cb);
  Zb__V1__RankCosts *rc = &cb->m;
  zb__v1__rank_costs__init(rc);
  zb__v1__double_value__init(&cb->latency);
  cb->latency.value = spec->link_latency_us;
  pb->link_latency_us = &cb->latency;
  pb->data_parallel = spec->data_parallel;
  pb->zero = spec->zero;
  pb->rank_order = (char *)spec->rank_order;
  pb->torch_run = (char *)spec->torch_run;
  pb->link_gbps = spec->link_gbps;
  rc->t_f = spec->costs.t_f;
  rc->t_b = spec->costs.t_b;
  rc->t_w = spec->costs.t_w;
  rc->t_comm = spec->costs.t_comm;
  rc->t_reduce = spec->costs.t_reduce;
  rc->m_f = spec->costs.m_f;
  rc->m_b = spec->costs.m_b;
  rc->m_w = spec->costs.m_w;
  pb->costs = rc;
  if (spec->n_stage_costs > 0) {
    pb->n_stage_costs = (size_t)spec->n_stage_costs;
    pb->stage_costs = zb_malloc(sizeof *pb->stage_costs * pb->n_stage_costs);
    Zb__V1__StageCosts *arr = zb_malloc(sizeof *arr * pb->n_stage_costs);
    for (int k = 0; k < spec->n_stage_costs; k++) {
      zb__v1__stage_costs__init(&arr[k]);
      arr[k].t_f = spec->stage_costs[k][0];
      arr[k].t_b = spec->stage_costs[k][1];
      arr[k].t_w = spec->stage_costs[k][2];
      pb->stage_costs[k] = &arr[k];
    }
  }
  pb->iterations = spec->iterations;
  pb->backend = (char *)spec->backend;
  pb->transport = (char *)spec->transport;
  pb->precision = (char *)spec->precision;
  pb->bytes_per_activation = spec->bytes_per_activation;
  pb->trace_every = spec->trace_every > 0 ? spec->trace_every : -1;
  pb->wait_for_workers_s = spec->wait_for_workers_s > 0 ? spec->wait_for_workers_s : -1;
  pb->transfer_timeout_s = spec->transfer_timeout_s;
  { /* always sent: every setting survives the trip, min_gain 0 included */
    zb_wire_adaptive_pb *a = zb_malloc(sizeof *a);
    zb__v1__adaptive_spec__init(&a->m);
    zb__v1__double_value__init(&a->min_gain);
    a->m.mode = spec->adaptive.enabled == 1   ? ZB__V1__ADAPTIVE_MODE__ADAPTIVE_MODE_ON
                : spec->adaptive.enabled == 0 ? ZB__V1__ADAPTIVE_MODE__ADAPTIVE_MODE_OFF
                                              : ZB__V1__ADAPTIVE_MODE__ADAPTIVE_MODE_DEFAULT;
    a->min_gain.value = spec->adaptive.min_gain;
    a->m.min_gain = &a->min_gain;
    a->m.check_every = spec->adaptive.check_every;
    pb->adaptive = &a->m;
  }
  if (spec->has_model || zb_job_spec_trains_model(spec)) {
    /* one block: the message first, so pb_clear frees it by pb->model */
    zb_wire_model_pb *block = zb_malloc(sizeof *block);
    zb_wire_model_to_pb(&spec->model, block);
    pb->model = &block->m;
  }
}

void zb_wire_spec_pb_clear(Zb__V1__JobSpec *pb) {
  free(pb->model);
  pb->model = NULL;
  free(pb->adaptive);
  pb->adaptive = NULL;
  free(pb->costs);
  pb->link_latency_us = NULL;
  if (pb->n_stage_costs > 0)
    free(pb->stage_costs[0]);
  free(pb->stage_costs);
  pb->costs = NULL;
  pb->stage_costs = NULL;
  pb->n_stage_costs = 0;
}

void zb_wire_rank_actions(const zb_schedule *s, int r, Zb__V1__RankActions *out) {
  zb__v1__rank_actions__init(out);
  out->rank = r;
  const zb_rank_list *l = &s->ranks[r];
  out->n_actions = (size_t)l->n;
  out->actions = zb_malloc(sizeof(char *) * (size_t)(l->n > 0 ? l->n : 1));
  for (int i = 0; i < l->n; i++) {
    char buf[64];
    zb_action_format(&l->actions[i], buf, (int)sizeof buf);
    out->actions[i] = zb_strdup(buf);
  }
}

void zb_wire_rank_actions_clear(Zb__V1__RankActions *ra) {
  for (size_t i = 0; i < ra->n_actions; i++)
    free(ra->actions[i]);
  free(ra->actions);
  ra->actions = NULL;
  ra->n_actions = 0;
}

zb_err zb_wire_rank_actions_parse(const Zb__V1__RankActions *ra, zb_schedule *s, zb_diag *diag) {
  if (ra->rank < 0 || ra->rank >= s->p)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "actions.rank: %d is not a rank of %d", ra->rank, s->p);
  for (size_t i = 0; i < ra->n_actions; i++) {
    zb_action a;
    zb_diag d;
    if (zb_action_parse(ra->actions[i], &a, &d) != ZB_OK)
      return zb_diag_set(diag, ZB_ERR_PARSE, "actions[%zu]: %s", i, d.msg);
    zb_schedule_push(s, ra->rank, a);
  }
  return ZB_OK;
}

void zb_wire_plan_response(const zb_planner_result *plan, bool action_lists, Zb__V1__PlanResponse *resp) {
  zb__v1__plan_response__init(resp);
  resp->schedule = (char *)zb_family_name(plan->family);
  resp->ranks = plan->p;
  resp->chunks = plan->v;
  resp->microbatches = plan->m;
  resp->makespan = plan->sim->makespan;
  resp->bubble_ratio = plan->sim->bubble_ratio;
  resp->bubble_ratio_paper = plan->sim->bubble_ratio_paper;
  resp->n_peak_memory = (size_t)plan->p;
  resp->peak_memory = zb_malloc(sizeof(double) * (size_t)plan->p);
  for (int r = 0; r < plan->p; r++)
    resp->peak_memory[r] = plan->sim->peak_memory_units[r];
  if (plan->sim_compute) {
    const zb_sim_result *c = plan->sim_compute;
    Zb__V1__PlanFigures *f = zb_malloc(sizeof *f);
    zb__v1__plan_figures__init(f);
    f->makespan = c->makespan;
    f->bubble_ratio = c->bubble_ratio;
    f->bubble_ratio_paper = c->bubble_ratio_paper;
    f->n_peak_memory = (size_t)plan->p;
    f->peak_memory = zb_malloc(sizeof(double) * (size_t)plan->p);
    for (int r = 0; r < plan->p; r++)
      f->peak_memory[r] = c->peak_memory_units[r];
    resp->compute_only = f;
  }
  resp->generation_seconds = plan->generate_seconds > 0 ? plan->generate_seconds : 0;
  resp->n_actions = (size_t)plan->p;
  resp->actions = zb_malloc(sizeof *resp->actions * (size_t)plan->p);
  for (int r = 0; r < plan->p; r++) {
    resp->actions[r] = zb_malloc(sizeof **resp->actions);
    zb_wire_rank_actions(plan->lowered, r, resp->actions[r]);
  }
  if (!action_lists)
    return;
  resp->n_action_lists = (size_t)plan->p;
  resp->action_lists = zb_malloc(sizeof *resp->action_lists * (size_t)plan->p);
  for (int r = 0; r < plan->p; r++)
    resp->action_lists[r] = zb_action_list_encode(&plan->lowered->ranks[r]);
}

void zb_wire_plan_response_clear(Zb__V1__PlanResponse *resp) {
  for (size_t r = 0; r < resp->n_actions; r++) {
    zb_wire_rank_actions_clear(resp->actions[r]);
    free(resp->actions[r]);
  }
  free(resp->actions);
  for (size_t r = 0; r < resp->n_action_lists; r++)
    zb_action_list_free(resp->action_lists[r]);
  free(resp->action_lists);
  resp->action_lists = NULL;
  resp->n_action_lists = 0;
  free(resp->peak_memory);
  if (resp->compute_only)
    free(resp->compute_only->peak_memory);
  free(resp->compute_only);
  resp->compute_only = NULL;
  resp->actions = NULL;
  resp->peak_memory = NULL;
  resp->n_actions = resp->n_peak_memory = 0;
}

_Static_assert((int)ZB_JOB_PENDING == (int)ZB__V1__JOB_STATE__JOB_STATE_PENDING &&
                   (int)ZB_JOB_RUNNING == (int)ZB__V1__JOB_STATE__JOB_STATE_RUNNING &&
                   (int)ZB_JOB_SUCCEEDED == (int)ZB__V1__JOB_STATE__JOB_STATE_SUCCEEDED &&
                   (int)ZB_JOB_FAILED == (int)ZB__V1__JOB_STATE__JOB_STATE_FAILED &&
                   (int)ZB_JOB_CANCELLED == (int)ZB__V1__JOB_STATE__JOB_STATE_CANCELLED,
               "zb_job_state must number the states as zb.v1.JobState does");
