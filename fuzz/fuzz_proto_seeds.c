/* fuzz_proto_seeds.c — writes fuzz_proto's seed corpus: real messages,
 * encoded by the project's own encoders from a sim job and a cpu job (the
 * specs below, shaped like deploy/jobs), their plans, assignments (the
 * current form and the older all-ranks one) and timelines, each file the
 * selector byte of fuzz_proto_messages.h then the packed message. Seeds
 * that start where the coordinator's and the worker's encoders end let
 * the fuzzer reach the decoders' checks at once instead of rediscovering
 * the message layouts. Usage: fuzz_proto_seeds OUTDIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_proto_messages.h"
#include "zb_assignment.h"
#include "zb_job_plan.h"
#include "zb_jobspec_yaml.h"
#include "zb_timeline_pb.h"
#include "zb_wire.h"

static const char *out_dir;

static const char sim_yaml[] = "name: seed-sim\nranks: 4\nmicrobatches: 8\nschedule: zb-v\n"
                               "costs: {f: 0.01, b: 0.012, w: 0.008, comm: 0.001}\n"
                               "iterations: 3\nmem_limit: 2p\ntrace_every: 1\n";
static const char cpu_yaml[] = "name: seed-cpu\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\n"
                               "model: {hidden: 16, heads: 2, seq_len: 8, batch: 2, lr: 0.001}\n"
                               "adaptive: {enabled: false}\n";

static void write_seed(const char *name, const ProtobufCMessage *m) {
  int sel = fuzz_proto_index(m->descriptor);
  if (sel < 0) {
    fprintf(stderr, "fuzz_proto_seeds: %s is not in fuzz_proto_messages.h\n", m->descriptor->name);
    exit(1);
  }
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(n + 1);
  b[0] = (uint8_t)sel;
  protobuf_c_message_pack(m, b + 1);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", out_dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(b, 1, n + 1, f) != n + 1 || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
  free(b);
}

static void parse_spec(const char *yaml, zb_job_spec *spec) {
  zb_diag d = {{0}};
  if (zb_job_spec_parse(yaml, strlen(yaml), spec, &d) != ZB_OK) {
    fprintf(stderr, "fuzz_proto_seeds: spec: %s\n", d.msg);
    exit(1);
  }
}

/* JobSpec alone, in a submission and in a Plan call. */
static void spec_seeds(const char *tag, const zb_job_spec *spec) {
  char name[64];
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(spec, &pb);
  snprintf(name, sizeof name, "jobspec-%s", tag);
  write_seed(name, &pb.base);
  Zb__V1__SubmitJobRequest sub = ZB__V1__SUBMIT_JOB_REQUEST__INIT;
  sub.spec = &pb;
  snprintf(name, sizeof name, "submit-%s", tag);
  write_seed(name, &sub.base);
  Zb__V1__PlanRequest plan = ZB__V1__PLAN_REQUEST__INIT;
  plan.spec = &pb;
  plan.with_action_lists = true;
  snprintf(name, sizeof name, "plan-request-%s", tag);
  write_seed(name, &plan.base);
  zb_wire_spec_pb_clear(&pb);
}

/* Rank r's Assignment in the older all-ranks form: action strings, peer
 * addresses by rank, every stage's costs. */
static void old_form_seed(const zb_planner_result *plan, Zb__V1__Assignment *a, int r) {
  int S = plan->p * plan->v;
  Zb__V1__RankActions ra;
  zb_wire_rank_actions(plan->lowered, r, &ra);
  Zb__V1__StageCosts *sc = calloc((size_t)S, sizeof *sc), **scp = calloc((size_t)S, sizeof *scp);
  double *mf = calloc((size_t)S, sizeof *mf), *mb = calloc((size_t)S, sizeof *mb),
         *mw = calloc((size_t)S, sizeof *mw);
  for (int s = 0; s < S; s++) {
    zb__v1__stage_costs__init(&sc[s]);
    sc[s].t_f = plan->costs->t_f[s];
    sc[s].t_b = plan->costs->t_b[s];
    sc[s].t_w = plan->costs->t_w[s];
    scp[s] = &sc[s];
    mf[s] = plan->costs->m_f[s];
    mb[s] = plan->costs->m_b[s];
    mw[s] = plan->costs->m_w[s];
  }
  char *addrs[4] = {"127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103", "127.0.0.1:7104"};
  Zb__V1__Assignment old = *a;
  old.action_list = NULL, old.n_peers = 0, old.peers = NULL, old.n_stages = 0, old.stages = NULL;
  old.chunks = 0;
  old.actions = &ra;
  old.n_peer_addresses = (size_t)plan->p, old.peer_addresses = addrs;
  old.n_stage_seconds = (size_t)S, old.stage_seconds = scp;
  old.n_stage_m_f = old.n_stage_m_b = old.n_stage_m_w = (size_t)S;
  old.stage_m_f = mf, old.stage_m_b = mb, old.stage_m_w = mw;
  write_seed("assignment-old-form", &old.base);
  zb_wire_rank_actions_clear(&ra);
  free(sc), free(scp), free(mf), free(mb), free(mw);
}

/* Each rank's Assignment of spec's plan, one in a Command, and the plan
 * as PlanResponse, RankActions and ActionList. */
static void plan_seeds(const char *tag, const zb_job_spec *spec, bool old_form) {
  zb_planner_result plan = {0};
  zb_diag d = {{0}};
  if (zb_job_plan(spec, ZB_OBJ_MAKESPAN, &plan, &d) != ZB_OK) {
    fprintf(stderr, "fuzz_proto_seeds: plan: %s\n", d.msg);
    exit(1);
  }
  const char *addrs[4] = {"127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103", "127.0.0.1:7104"};
  uint8_t secret[ZB_DATA_SECRET_BYTES] = {1, 2, 3};
  zb_assignment_src src = {.job_id = "job-1",
                           .spec = spec,
                           .plan = &plan,
                           .addresses = addrs,
                           .plan_version = 1,
                           .data_secret = secret};
  char name[64];
  for (int r = 0; r < plan.p && r < 2; r++) {
    Zb__V1__Assignment a;
    zb_assignment_encode(&src, r, &a);
    snprintf(name, sizeof name, "assignment-%s-rank%d", tag, r);
    write_seed(name, &a.base);
    if (r == 1) {
      Zb__V1__Command cmd = ZB__V1__COMMAND__INIT;
      cmd.kind_case = ZB__V1__COMMAND__KIND_ASSIGN;
      cmd.assign = &a;
      snprintf(name, sizeof name, "command-assign-%s", tag);
      write_seed(name, &cmd.base);
      if (old_form)
        old_form_seed(&plan, &a, r);
    }
    zb_assignment_encode_clear(&a);
  }
  Zb__V1__PlanResponse resp;
  zb_wire_plan_response(&plan, true, &resp);
  snprintf(name, sizeof name, "plan-response-%s", tag);
  write_seed(name, &resp.base);
  if (resp.n_actions > 0) {
    snprintf(name, sizeof name, "rank-actions-%s", tag);
    write_seed(name, &resp.actions[0]->base);
  }
  if (resp.n_action_lists > 0) {
    snprintf(name, sizeof name, "action-list-%s", tag);
    write_seed(name, &resp.action_lists[0]->base);
  }
  zb_wire_plan_response_clear(&resp);
  zb_planner_result_free(&plan);
}

/* Two ranks' timelines of one iteration, in every message that carries
 * them. */
static void timeline_seeds(const zb_job_spec *spec) {
  const zb_tl_op ops0[] = {{ZB_OP_F, 0, 0, 0, 0.000, 0.010},
                           {ZB_OP_SEND_F, 0, 0, 1, 0.010, 0.011},
                           {ZB_OP_RECV_B, 0, 0, 1, 0.011, 0.030},
                           {ZB_OP_B, 0, 0, 0, 0.030, 0.040},
                           {ZB_OP_W, 0, 0, 0, 0.040, 0.050}};
  const zb_tl_op ops1[] = {{ZB_OP_RECV_F, 1, 0, 1, 0.000, 0.011},
                           {ZB_OP_F, 1, 0, 0, 0.011, 0.021},
                           {ZB_OP_BW, 1, 0, 0, 0.021, 0.041},
                           {ZB_OP_SEND_B, 1, 0, 1, 0.041, 0.042}};
  Zb__V1__OpTimeline *t0 = zb_timeline_encode(ops0, 5), *t1 = zb_timeline_encode(ops1, 4);
  write_seed("op-timeline", &t0->base);
  Zb__V1__RankIteration r0 = ZB__V1__RANK_ITERATION__INIT, r1 = ZB__V1__RANK_ITERATION__INIT;
  r0.rank = 0, r0.wall_seconds = 0.05, r0.start_monotonic_seconds = 100, r0.timeline = t0;
  r1.rank = 1, r1.wall_seconds = 0.05, r1.start_monotonic_seconds = 250, r1.clock_offset_seconds = -150;
  r1.timeline = t1;
  Zb__V1__ReportRequest rep = ZB__V1__REPORT_REQUEST__INIT;
  rep.worker_id = "w1", rep.job_id = "job-1", rep.rank = 1, rep.plan_version = 1, rep.metrics = &r1;
  rep.sent_seconds = 251;
  write_seed("report-request", &rep.base);
  Zb__V1__RankIteration *ranks[2] = {&r0, &r1};
  Zb__V1__IterationMetrics it = ZB__V1__ITERATION_METRICS__INIT;
  it.schedule = "1f1b", it.n_ranks = 2, it.ranks = ranks, it.wall_seconds = 0.05;
  write_seed("iteration-metrics", &it.base);
  Zb__V1__JobEvent ev = ZB__V1__JOB_EVENT__INIT;
  ev.seq = 3, ev.state = ZB__V1__JOB_STATE__JOB_STATE_RUNNING, ev.iteration = &it;
  write_seed("job-event", &ev.base);
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(spec, &pb);
  Zb__V1__Job job = ZB__V1__JOB__INIT;
  job.id = "job-1", job.spec = &pb, job.state = ZB__V1__JOB_STATE__JOB_STATE_RUNNING, job.last = &it;
  write_seed("job", &job.base);
  zb_wire_spec_pb_clear(&pb);
  zb_timeline_pb_free(t0);
  zb_timeline_pb_free(t1);
}

/* The small requests and responses, with their fields set. */
static void small_seeds(void) {
  Zb__V1__GetJobRequest get = ZB__V1__GET_JOB_REQUEST__INIT;
  get.job_id = "job-1";
  write_seed("get-job", &get.base);
  Zb__V1__CancelJobRequest cancel = ZB__V1__CANCEL_JOB_REQUEST__INIT;
  cancel.job_id = "job-1", cancel.reason = "enough";
  write_seed("cancel-job", &cancel.base);
  Zb__V1__UpdateScheduleRequest upd = ZB__V1__UPDATE_SCHEDULE_REQUEST__INIT;
  upd.job_id = "job-1", upd.schedule = "zb-v", upd.chunks = 2, upd.mem_limit = 8;
  write_seed("update-schedule", &upd.base);
  char *backends[] = {"sim", "cpu"}, *transports[] = {"tcp"};
  Zb__V1__AttachRequest att = ZB__V1__ATTACH_REQUEST__INIT;
  att.worker_id = "w1", att.data_address = "127.0.0.1:7101", att.hostname = "host";
  att.n_backends = 2, att.backends = backends, att.n_transports = 1, att.transports = transports;
  att.max_receive_bytes = 16777216;
  write_seed("attach", &att.base);
  uint8_t id[ZB_NCCL_ID_BYTES] = {7};
  Zb__V1__NcclId nccl = ZB__V1__NCCL_ID__INIT;
  nccl.job_id = "job-1", nccl.unique_id.len = sizeof id, nccl.unique_id.data = id;
  write_seed("nccl-id", &nccl.base);
  Zb__V1__Command release = ZB__V1__COMMAND__INIT;
  release.kind_case = ZB__V1__COMMAND__KIND_RELEASE_JOB_ID, release.release_job_id = "job-1";
  write_seed("command-release", &release.base);
  Zb__V1__ReportResponse rr = ZB__V1__REPORT_RESPONSE__INIT;
  rr.received_seconds = 1.5, rr.replied_seconds = 1.6;
  write_seed("report-response", &rr.base);
  Grpc__Health__V1__HealthCheckRequest hc = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hc.service = "zb.v1.Zb";
  write_seed("health-check", &hc.base);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_proto_seeds OUTDIR\n");
    return 2;
  }
  out_dir = argv[1];
  zb_job_spec sim, cpu;
  parse_spec(sim_yaml, &sim);
  parse_spec(cpu_yaml, &cpu);
  spec_seeds("sim", &sim);
  spec_seeds("cpu", &cpu);
  plan_seeds("sim", &sim, true);
  plan_seeds("cpu", &cpu, false);
  timeline_seeds(&cpu);
  small_seeds();
  zb_job_spec_free(&sim);
  zb_job_spec_free(&cpu);
  return 0;
}
