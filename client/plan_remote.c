/* plan_remote.c — `zbctl plan --remote`: the coordinator plans the spec
 * (the Plan RPC, under its planning budget) and zbctl prints the answer. */
#include <stdio.h>

#include "zb_methods.h"
#include "zb_pbjson.h"
#include "zb_wire.h"
#include "zbctl.h"

int zbctl_plan_remote(const char *coordinator, int timeout_ms, const zb_job_spec *spec, const char *objective,
                      bool json) {
  if (!coordinator)
    coordinator = zbctl_default_coordinator();
  Zb__V1__PlanRequest req = ZB__V1__PLAN_REQUEST__INIT;
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(spec, &pb);
  req.spec = &pb;
  req.objective = (char *)(objective ? objective : "");
  ProtobufCMessage *resp = NULL;
  int rc = zbctl_remote_call("plan", coordinator, timeout_ms, ZB_METHOD_PLAN, &req.base,
                             &zb__v1__plan_response__descriptor, &resp);
  zb_wire_spec_pb_clear(&pb);
  if (rc)
    return rc;
  Zb__V1__PlanResponse *r = (void *)resp;
  if (json) {
    zb_buf b = ZB_BUF_INIT;
    zb_pbjson_write(resp, 0, &b);
    printf("%.*s\n", (int)b.len, b.data);
    zb_buf_free(&b);
  } else {
    printf("%s (planned by zb-coordinator at %s): p=%d v=%d m=%d\n", r->schedule, coordinator, r->ranks,
           r->chunks, r->microbatches);
    printf("makespan %g  bubble_ratio %.4f (global)  bubble_ratio_paper %.4f  generated in %.3f ms\n",
           r->makespan, r->bubble_ratio, r->bubble_ratio_paper, r->generation_seconds * 1e3);
    if (r->compute_only)
      printf("compute-only lists (transfers as latency, the paper's view): makespan %g  bubble_ratio %.4f  "
             "bubble_ratio_paper %.4f\n",
             r->compute_only->makespan, r->compute_only->bubble_ratio, r->compute_only->bubble_ratio_paper);
    printf("peak memory (M_F units):");
    for (size_t k = 0; k < r->n_peak_memory; k++)
      printf(" %g", r->peak_memory[k]);
    printf("\n");
    for (size_t k = 0; k < r->n_actions; k++) {
      printf("rank %d:", r->actions[k]->rank);
      for (size_t i = 0; i < r->actions[k]->n_actions; i++)
        printf(" %s", r->actions[k]->actions[i]);
      printf("\n");
    }
  }
  protobuf_c_message_free_unpacked(resp, NULL);
  return ZBCTL_EXIT_OK;
}
