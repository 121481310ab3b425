/* test_jobspec_dp.c — the data-parallel keys of a job spec from real YAML
 * text: defaults, every key parsed, the errors naming the key, the wire's
 * round trip, and T_reduce derived as a ring all-reduce of each stage's
 * gradients (zb_jobspec_dp.h). */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "zb_jobspec_dp.h"
#include "zb_jobspec_yaml.h"
#include "zb_wire.h"
#include "zbtest.h"

#define BASE "name: dp\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\n"

/* Parses yaml; returns the error and leaves the message in d. */
static zb_err parse(const char *yaml, zb_job_spec *s, zb_diag *d) {
  return zb_job_spec_parse(yaml, strlen(yaml), s, d);
}

/* yaml must fail with want and the message must hold key and part. */
static bool refused(const char *yaml, zb_err want, const char *key, const char *part) {
  zb_job_spec s;
  zb_diag d = {{0}};
  zb_err got = parse(yaml, &s, &d);
  zb_job_spec_free(&s);
  bool ok = got == want && strstr(d.msg, key) && strstr(d.msg, part);
  if (!ok)
    fprintf(stderr, "    got %d (%s), want %d with '%s' and '%s'\n", got, d.msg, want, key, part);
  return ok;
}

static void test_dp_defaults(void) {
  zb_job_spec s;
  zb_diag d = {{0}};
  CHECK_EQ(parse(BASE, &s, &d), ZB_OK);
  CHECK_EQ(s.data_parallel, 1);
  CHECK_EQ(s.zero, 0);
  CHECK_STREQ(s.rank_order, ZB_RANK_ORDER_PIPELINES);
  CHECK_NEAR(s.link_gbps, 100, 0);
  CHECK_NEAR(s.link_latency_us, 10, 0);
  CHECK_NEAR(s.costs.t_reduce, 0, 0);
  CHECK_EQ(zb_job_spec_world(&s), 2);
  CHECK(!zb_job_spec_derives_reduce(&s));
  zb_job_spec_free(&s);
}

static void test_dp_keys_parsed(void) {
  zb_job_spec s;
  zb_diag d = {{0}};
  CHECK_EQ(parse(BASE "data_parallel: 3\nrank_order: stages\nlink_gbps: 25\nlink_latency_us: 0\n"
                      "costs: {reduce: 0.004}\n",
                 &s, &d),
           ZB_OK);
  CHECK_EQ(s.data_parallel, 3);
  CHECK_STREQ(s.rank_order, ZB_RANK_ORDER_STAGES);
  CHECK_NEAR(s.link_gbps, 25, 0);
  CHECK_NEAR(s.link_latency_us, 0, 0);
  CHECK_NEAR(s.costs.t_reduce, 0.004, 0);
  CHECK_EQ(zb_job_spec_world(&s), 6);
  /* global rank g = replica x p + pipeline rank */
  CHECK_EQ(zb_dp_replica(5, 2), 2);
  CHECK_EQ(zb_dp_pipeline_rank(5, 2), 1);
  CHECK_EQ(zb_dp_global(2, 1, 2), 5);
  /* the wire keeps every field */
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(&s, &pb);
  zb_job_spec back;
  CHECK_EQ(zb_wire_spec_from_pb(&pb, &back, &d), ZB_OK);
  zb_wire_spec_pb_clear(&pb);
  CHECK_EQ(back.data_parallel, 3);
  CHECK_STREQ(back.rank_order, ZB_RANK_ORDER_STAGES);
  CHECK_NEAR(back.link_gbps, 25, 0);
  CHECK_NEAR(back.link_latency_us, 0, 0);
  CHECK_NEAR(back.costs.t_reduce, 0.004, 0);
  zb_job_spec_free(&back);
  zb_job_spec_free(&s);
}

static void test_dp_errors(void) {
  CHECK(refused(BASE "data_parallel: 0\n", ZB_ERR_PARSE, "data_parallel", "line 5"));
  CHECK(refused(BASE "data_parallel: 513\n", ZB_ERR_INVALID_ARG, "data_parallel", "over the limit of 1024"));
  CHECK(refused(BASE "data_parallel: 2000\n", ZB_ERR_INVALID_ARG, "data_parallel", "between 1 and 1024"));
  CHECK(refused(BASE "zero: 2\n", ZB_ERR_INVALID_ARG, "'zero'", "must be 0 or 1"));
  CHECK(refused(BASE "data_parallel: 2\nzero: 1\n", ZB_ERR_INVALID_ARG, "'zero'", "backend is 'sim'"));
  CHECK(refused(BASE "backend: cpu\nzero: 1\n", ZB_ERR_INVALID_ARG, "'zero'", "needs data_parallel > 1"));
  CHECK(refused(BASE "rank_order: hosts\n", ZB_ERR_INVALID_ARG, "rank_order", "pipelines, stages"));
  CHECK(refused(BASE "link_gbps: 0\n", ZB_ERR_INVALID_ARG, "link_gbps", "> 0"));
  CHECK(refused(BASE "link_latency_us: -1\n", ZB_ERR_INVALID_ARG, "link_latency_us", ">= 0"));
  CHECK(refused(BASE "costs: {reduce: -1}\n", ZB_ERR_INVALID_ARG, "costs.reduce", "line 5"));
  /* the wire's values go through the same checker */
  zb_job_spec s;
  zb_diag d = {{0}};
  CHECK_EQ(parse(BASE, &s, &d), ZB_OK);
  s.zero = 1;
  CHECK_EQ(zb_job_spec_check(&s, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "'zero'") != NULL);
  zb_job_spec_free(&s);
}

static void test_ring_allreduce(void) {
  CHECK_NEAR(zb_ring_allreduce_seconds(1, 1e9, 100, 10), 0, 0);
  /* d = 2: (2-1)/2 x 2 = 1 x bytes over 12.5 GB/s, plus 2 hops of 10 us */
  CHECK_NEAR(zb_ring_allreduce_seconds(2, 1.25e9, 100, 10), 0.1 + 20e-6, 1e-12);
  /* d = 4: 2 x 3/4 = 1.5 x bytes, 6 hops */
  CHECK_NEAR(zb_ring_allreduce_seconds(4, 1e9, 8, 1), 1.5 + 6e-6, 1e-12);
}

static void test_reduce_derived_per_stage(void) {
  zb_job_spec s;
  zb_diag d = {{0}};
  CHECK_EQ(parse(BASE "backend: cpu\ndata_parallel: 2\nlink_gbps: 8\nlink_latency_us: 0\n"
                      "model: {hidden: 8, heads: 2, layers: 2, seq_len: 4, batch: 1}\n",
                 &s, &d),
           ZB_OK);
  CHECK(zb_job_spec_derives_reduce(&s));
  double t[2];
  CHECK_EQ(zb_job_spec_reduce_times(&s, 2, t, &d), ZB_OK);
  /* d = 2 over 1 GB/s: T_reduce = gradient bytes / 1e9; the stages hold
   * the whole model between them */
  double b0 = zb_job_spec_stage_grad_bytes(&s, 0, 2), b1 = zb_job_spec_stage_grad_bytes(&s, 1, 2);
  CHECK(b0 > 0 && b1 > 0);
  CHECK_NEAR(t[0], b0 / 1e9, 1e-15);
  CHECK_NEAR(t[1], b1 / 1e9, 1e-15);
  CHECK_NEAR((b0 + b1) / 4, zb_model_spec_params(&s.model), 0.5);
  /* a given costs.reduce wins */
  s.costs.t_reduce = 0.5;
  CHECK(!zb_job_spec_derives_reduce(&s));
  zb_job_spec_free(&s);
}

ZBT_MAIN(ZBT(test_dp_defaults), ZBT(test_dp_keys_parsed), ZBT(test_dp_errors), ZBT(test_ring_allreduce),
         ZBT(test_reduce_derived_per_stage))
