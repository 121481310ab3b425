/* zb_jobspec_torch.c — the checks of a torch job (backend torch): a
 * torchrun job whose processes attach with zb.torch.attach (docs/pytorch.md,
 * Attaching a torchrun job). The script owns the model and its process
 * group moves the tensors, so the spec carries only the plan's shape and
 * costs, transport torch and the run id that binds ranks to processes. */
#include <stdio.h>
#include <string.h>

#include "zb_jobspec.h"
#include "zb_jobspec_fields.h"
#include "zb_names.h"

bool zb_torch_run_valid(const char *run, size_t cap) {
  size_t len = memchr(run, '\0', cap) ? strlen(run) : cap;
  bool ok = len >= 1 && len <= 63;
  for (size_t i = 0; ok && i < len; i++) {
    char c = run[i];
    ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
  }
  return ok;
}

/* The fields a job of another backend may not give. */
static zb_err check_not_torch(const zb_job_spec *s, zb_job_fault *f) {
  if (!memchr(s->torch_run, '\0', sizeof s->torch_run) || s->torch_run[0])
    return zb_job_fault_set(f, ZB_JK_TORCH_RUN, -1, "torch_run",
                            "binds a torch job to its torchrun processes; backend is '%.15s'", s->backend);
  if (memchr(s->transport, '\0', sizeof s->transport) && strcmp(s->transport, ZB_TRANSPORT_TORCH) == 0)
    return zb_job_fault_set(f, ZB_JK_TRANSPORT, -1, "transport",
                            "torch is the torchrun process group of a torch job; backend is '%.15s' "
                            "(use tcp)",
                            s->backend);
  return ZB_OK;
}

zb_err zb_job_spec_check_torch(const zb_job_spec *s, zb_job_fault *f) {
  if (!memchr(s->backend, '\0', sizeof s->backend) || strcmp(s->backend, ZB_BACKEND_TORCH) != 0)
    return check_not_torch(s, f);
  if (!zb_torch_run_valid(s->torch_run, sizeof s->torch_run))
    return zb_job_fault_set(f, ZB_JK_TORCH_RUN, -1, "torch_run",
                            "is required for backend torch: the run id every process passes to "
                            "zb.torch.attach, 1..63 characters of [A-Za-z0-9._-], got '%.40s'",
                            memchr(s->torch_run, '\0', sizeof s->torch_run) ? s->torch_run : "");
  if (!memchr(s->transport, '\0', sizeof s->transport) || strcmp(s->transport, ZB_TRANSPORT_TORCH) != 0)
    return zb_job_fault_set(f, ZB_JK_TRANSPORT, -1, "transport",
                            "must be torch for backend torch (the torchrun process group moves the "
                            "tensors, not zb), got '%.15s'",
                            s->transport);
  if (s->data_parallel != 1)
    return zb_job_fault_set(f, ZB_JK_DATA_PARALLEL, -1, "data_parallel",
                            "a torch job runs one pipeline (zb rank r is torchrun rank r); got %d",
                            s->data_parallel);
  if (s->zero != 0)
    return zb_job_fault_set(f, ZB_JK_ZERO, -1, "zero",
                            "a torch job's optimizer is the script's own; zb does not shard it");
  if (s->has_model)
    return zb_job_fault_set(f, ZB_JK_MODEL, -1, "model",
                            "a torch job's model is the script's own (give its costs, e.g. from "
                            "zb.torch.profile)");
  return ZB_OK;
}
