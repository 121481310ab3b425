/* test_jobspec_torch.c — a torch job's spec from real YAML text
 * (zb_jobspec_torch.c): backend torch with transport torch and torch_run
 * accepted and carried over the wire; each rule's refusal names its field. */
#include <stdbool.h>
#include <string.h>

#include "zb_jobspec_yaml.h"
#include "zb_wire.h"
#include "zbtest.h"

#define BASE "name: t\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\n"
#define TORCH BASE "backend: torch\ntransport: torch\n"

/* yaml must be refused and the message must hold field and part. */
static bool refused(const char *yaml, const char *field, const char *part) {
  zb_job_spec s;
  zb_diag d = {{0}};
  zb_err got = zb_job_spec_parse(yaml, strlen(yaml), &s, &d);
  zb_job_spec_free(&s);
  bool ok = got == ZB_ERR_INVALID_ARG && strstr(d.msg, field) && strstr(d.msg, part);
  if (!ok)
    fprintf(stderr, "    got %d (%s), want '%s' and '%s'\n", got, d.msg, field, part);
  return ok;
}

static void test_torch_job_accepted_and_carried(void) {
  zb_job_spec s, back;
  zb_diag d = {{0}};
  const char *yaml = TORCH "torch_run: run-1.a_b\ncosts: {f: 0.002, b: 0.003, w: 0.001}\n";
  CHECK_EQ(zb_job_spec_parse(yaml, strlen(yaml), &s, &d), ZB_OK);
  CHECK_STREQ(s.backend, ZB_BACKEND_TORCH);
  CHECK_STREQ(s.transport, ZB_TRANSPORT_TORCH);
  CHECK_STREQ(s.torch_run, "run-1.a_b");
  CHECK(!zb_job_spec_trains_model(&s));
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(&s, &pb);
  CHECK_EQ(zb_wire_spec_from_pb(&pb, &back, &d), ZB_OK);
  CHECK_STREQ(back.torch_run, "run-1.a_b");
  CHECK_STREQ(back.backend, ZB_BACKEND_TORCH);
  zb_wire_spec_pb_clear(&pb);
  zb_job_spec_free(&back);
  zb_job_spec_free(&s);
}

static void test_torch_job_errors(void) {
  CHECK(refused(TORCH, "torch_run", "required for backend torch"));
  CHECK(refused(TORCH "torch_run: 'a b'\n", "torch_run", "[A-Za-z0-9._-]"));
  CHECK(refused(BASE "backend: torch\ntorch_run: r\n", "transport", "must be torch for backend torch"));
  CHECK(refused(TORCH "torch_run: r\ndata_parallel: 2\n", "data_parallel", "one pipeline"));
  CHECK(refused(TORCH "torch_run: r\nmodel: {hidden: 8}\n", "model", "script's own"));
  CHECK(refused(TORCH "torch_run: r\nzero: 1\n", "zero", "zb does not shard it"));
  CHECK(refused(BASE "torch_run: r\n", "torch_run", "backend is 'sim'"));
  CHECK(refused(BASE "transport: torch\n", "transport", "(use tcp)"));
  CHECK(refused(BASE "backend: torchx\n", "backend", "sim, cpu, cuda, torch"));
}

/* A SubmitJob's torch_run one character past the 63 a run id may have is
 * refused naming the field, not cut to a run id some agents would match. */
static void test_wire_torch_run_too_long(void) {
  zb_job_spec s, back;
  zb_diag d = {{0}};
  const char *yaml = TORCH "torch_run: r\n";
  CHECK_EQ(zb_job_spec_parse(yaml, strlen(yaml), &s, &d), ZB_OK);
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(&s, &pb);
  char run[65];
  memset(run, 'a', 64);
  run[64] = 0;
  pb.torch_run = run;
  CHECK_EQ(zb_wire_spec_from_pb(&pb, &back, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "torch_run") != NULL);
  run[63] = 0; /* 63: the most a run id has */
  CHECK_EQ(zb_wire_spec_from_pb(&pb, &back, &d), ZB_OK);
  CHECK_STREQ(back.torch_run, run);
  zb_job_spec_free(&back);
  pb.torch_run = (char *)s.torch_run;
  zb_wire_spec_pb_clear(&pb);
  zb_job_spec_free(&s);
}

ZBT_MAIN(ZBT(test_torch_job_accepted_and_carried), ZBT(test_torch_job_errors),
         ZBT(test_wire_torch_run_too_long))
