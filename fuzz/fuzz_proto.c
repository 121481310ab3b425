/* fuzz_proto.c — every message's way in: protobuf-c's unpack of the bytes
 * a peer sent, then the project's conversion of that message where there
 * is one (common/), as the receiving process runs it:
 *   JobSpec, SubmitJobRequest, PlanRequest, Job: zb_wire_spec_from_pb;
 *   Assignment, Command.assign: zb_assignment_decode, whose promises the
 *     worker's executor relies on are checked (every action in range);
 *   ReportRequest, IterationMetrics, JobEvent, Job, OpTimeline:
 *     zb_timeline_decode, then the summary and the learned costs the
 *     coordinator derives from the decoded timelines;
 *   RankActions: zb_wire_rank_actions_parse; ActionList: the decoder's
 *     columns, by way of an Assignment around them;
 *   every message: zb_pbjson_write, zbctl's --output json.
 * The first byte picks the message (fuzz_proto_messages.h), the rest is
 * its encoding. Nothing may crash, leak or hit undefined behaviour.
 */
#include <string.h>

#include "fuzz.h"
#include "fuzz_proto_messages.h"
#include "zb_assignment.h"
#include "zb_buf.h"
#include "zb_pbjson.h"
#include "zb_timeline.h"
#include "zb_timeline_pb.h"
#include "zb_wire.h"

static void convert_spec(const Zb__V1__JobSpec *pb) {
  if (!pb)
    return;
  zb_job_spec spec;
  zb_diag d = {{0}};
  zb_err err = zb_wire_spec_from_pb(pb, &spec, &d);
  FUZZ_CHECK(err == ZB_OK || d.msg[0], "JobSpec: error %d without a message", (int)err);
  if (err == ZB_OK)
    zb_job_spec_free(&spec);
}

/* What the worker's executor takes for granted of a decoded list. */
static void check_assignment(const zb_assignment *a) {
  const zb_schedule *s = a->sched;
  int S = a->ranks * a->chunks;
  FUZZ_CHECK(s && s->p == a->ranks && s->v == a->chunks && s->m == a->microbatches, "schedule shape");
  FUZZ_CHECK(a->costs && a->costs->n_stages == S && a->peer_addresses, "costs or peers missing");
  const zb_rank_list *l = &s->ranks[a->rank];
  for (int i = 0; i < l->n; i++) {
    const zb_action *x = &l->actions[i];
    bool comm = zb_op_is_comm(x->op);
    FUZZ_CHECK(comm || zb_op_is_compute(x->op), "action %d: kind %d is neither compute nor comm", i, x->op);
    FUZZ_CHECK(x->stage >= 0 && x->stage < S, "action %d: stage %d of %d", i, x->stage, S);
    FUZZ_CHECK(x->mb >= 0 && x->mb < a->microbatches, "action %d: microbatch %d of %d", i, x->mb,
               a->microbatches);
    FUZZ_CHECK(comm ? x->peer >= 0 && x->peer < a->ranks && x->peer != a->rank : x->peer == -1,
               "action %d: peer %d of rank %d of %d", i, x->peer, a->rank, a->ranks);
  }
  for (int q = 0; q < a->ranks; q++)
    (void)zb_assignment_peer(a, q);
}

static void convert_assignment(const Zb__V1__Assignment *pb) {
  if (!pb)
    return;
  zb_assignment a;
  zb_diag d = {{0}};
  zb_err err = zb_assignment_decode(pb, &a, &d);
  FUZZ_CHECK(err == ZB_OK || d.msg[0], "Assignment: error %d without a message", (int)err);
  if (err == ZB_OK)
    check_assignment(&a);
  zb_assignment_free(&a);
}

/* The coordinator's use of p decoded timelines (daemon/reports.c): their
 * summary, and the costs they show against a prior of 8 stages. */
static void summarize(const zb_tl_rank *ranks, int p) {
  zb_tl_summary s = {0};
  zb_err err = zb_timeline_summarize(ranks, p, &s, NULL);
  zb_tl_summary_free(&s);
  if (err != ZB_OK)
    return;
  zb_rank_costs rc = zb_rank_costs_default();
  zb_costs *prior = zb_costs_from_rank_share(4, 2, &rc, 0);
  zb_tl_costs learned = {0};
  zb_timeline_costs(ranks, p, prior, &learned, NULL);
  zb_tl_costs_free(&learned);
  zb_costs_free(prior);
}

/* Decodes each rank's timeline (NULL ones skipped) on base[r]; summarizes
 * when all decode. */
static void convert_timelines(Zb__V1__OpTimeline *const *t, const double *base, int p) {
  zb_tl_rank *ranks = calloc((size_t)(p ? p : 1), sizeof *ranks);
  bool all = p > 0;
  for (int r = 0; r < p; r++) {
    zb_tl_op *ops = NULL;
    zb_diag d = {{0}};
    zb_err err = t[r] ? zb_timeline_decode(t[r], base[r], &ops, &ranks[r].n, &d) : ZB_ERR_INVALID_ARG;
    FUZZ_CHECK(!t[r] || err == ZB_OK || d.msg[0], "OpTimeline: error %d without a message", (int)err);
    all &= err == ZB_OK;
    ranks[r].ops = ops;
  }
  if (all)
    summarize(ranks, p);
  for (int r = 0; r < p; r++)
    free((void *)ranks[r].ops);
  free(ranks);
}

/* An iteration's ranks on the coordinator's clock, as reports.c and zbctl
 * trace place them. At most 64 ranks: the summary is per rank. */
static void convert_iteration(const Zb__V1__IterationMetrics *it) {
  if (!it)
    return;
  int p = it->n_ranks < 64 ? (int)it->n_ranks : 64;
  Zb__V1__OpTimeline *t[64];
  double base[64];
  for (int r = 0; r < p; r++) {
    t[r] = it->ranks[r]->timeline;
    base[r] = it->ranks[r]->start_monotonic_seconds + it->ranks[r]->clock_offset_seconds;
  }
  convert_timelines(t, base, p);
}

static void convert_rank_actions(const Zb__V1__RankActions *ra) {
  zb_schedule *s = zb_schedule_new(4, 2, 8, ZB_PLACE_V);
  zb_diag d = {{0}};
  zb_err err = zb_wire_rank_actions_parse(ra, s, &d);
  FUZZ_CHECK(err == ZB_OK || d.msg[0], "RankActions: error %d without a message", (int)err);
  zb_schedule_free(s);
}

/* An ActionList inside the smallest Assignment that reaches its columns. */
static void convert_action_list(Zb__V1__ActionList *al) {
  Zb__V1__Assignment a = ZB__V1__ASSIGNMENT__INIT;
  a.job_id = "fuzz";
  a.schedule = "zb-v";
  a.backend = "sim";
  a.transport = "tcp";
  a.rank = 1;
  a.ranks = 4;
  a.chunks = 2;
  a.microbatches = 8;
  a.iterations = 1;
  a.action_list = al;
  convert_assignment(&a);
}

static void convert(const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  if (d == &zb__v1__job_spec__descriptor)
    convert_spec((const Zb__V1__JobSpec *)m);
  else if (d == &zb__v1__submit_job_request__descriptor)
    convert_spec(((const Zb__V1__SubmitJobRequest *)m)->spec);
  else if (d == &zb__v1__plan_request__descriptor)
    convert_spec(((const Zb__V1__PlanRequest *)m)->spec);
  else if (d == &zb__v1__assignment__descriptor)
    convert_assignment((const Zb__V1__Assignment *)m);
  else if (d == &zb__v1__command__descriptor &&
           ((const Zb__V1__Command *)m)->kind_case == ZB__V1__COMMAND__KIND_ASSIGN)
    convert_assignment(((const Zb__V1__Command *)m)->assign);
  else if (d == &zb__v1__iteration_metrics__descriptor)
    convert_iteration((const Zb__V1__IterationMetrics *)m);
  else if (d == &zb__v1__job_event__descriptor)
    convert_iteration(((const Zb__V1__JobEvent *)m)->iteration);
  else if (d == &zb__v1__rank_actions__descriptor)
    convert_rank_actions((const Zb__V1__RankActions *)m);
  else if (d == &zb__v1__action_list__descriptor)
    convert_action_list((Zb__V1__ActionList *)m);
  if (d == &zb__v1__job__descriptor) {
    convert_spec(((const Zb__V1__Job *)m)->spec);
    convert_iteration(((const Zb__V1__Job *)m)->last);
  } else if (d == &zb__v1__report_request__descriptor && ((const Zb__V1__ReportRequest *)m)->metrics) {
    Zb__V1__OpTimeline *t = ((const Zb__V1__ReportRequest *)m)->metrics->timeline;
    convert_timelines(&t, &(double){0}, 1);
  } else if (d == &zb__v1__op_timeline__descriptor) {
    Zb__V1__OpTimeline *t = (Zb__V1__OpTimeline *)m;
    convert_timelines(&t, &(double){0}, 1);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  const ProtobufCMessageDescriptor *d = fuzz_proto_messages[data[0] % FUZZ_PROTO_COUNT];
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, size - 1, data + 1);
  if (!m)
    return 0;
  convert(m);
  zb_buf json = {0};
  zb_pbjson_write(m, data[0] & 0x80 ? 0 : -1, &json);
  zb_buf_free(&json);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
