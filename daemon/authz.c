/* authz.c — who may do what on the coordinator (docs/operations.md,
 * Security). The caller is who its client certificate says
 * (zb_rpc_call_identity): a worker may only Attach and Report, as the
 * worker id in its certificate, or as that id, '/' and a rank for the
 * processes of a torchrun run sharing one certificate (which then attach
 * bound to that rank); a user may plan, list the workers, and
 * submit, read, watch, cancel and re-plan its own jobs; an admin may do
 * all of that on every job. Reports are held to the job and rank the
 * worker was given (reports.c), and after a coordinator restart a rank
 * goes back only to the identity that ran it (recovery.c). A caller
 * without a certificate is UNAUTHENTICATED, one acting outside its role
 * PERMISSION_DENIED. In insecure mode (no TLS) every caller may do
 * everything. */
#include <stdio.h>
#include <string.h>

#include "coordinator.h"

bool authz_caller(coord *co, zb_rpc_call *call, unsigned roles, const char *action, zb_identity *who) {
  zb_rpc_call_identity(call, who);
  if (!co->tls)
    return true;
  if (who->role == ZB_ROLE_NONE) {
    zb_rpc_fail(call, GRPC_STATUS_UNAUTHENTICATED,
                "a client certificate signed by the cluster's CA, naming zb://ROLE/NAME, is required to %s",
                action);
    return false;
  }
  if (!(roles & (1u << who->role))) {
    zb_rpc_fail(call, GRPC_STATUS_PERMISSION_DENIED, "%s %s may not %s", zb_role_name(who->role), who->name,
                action);
    return false;
  }
  return true;
}

bool authz_owns(const coord *co, const zb_identity *who, const coord_job *j) {
  return !co->tls || who->role == ZB_ROLE_ADMIN ||
         (who->role == ZB_ROLE_USER && !strcmp(j->spec.owner, who->name));
}

bool authz_job(coord *co, zb_rpc_call *call, const zb_identity *who, const coord_job *j) {
  if (authz_owns(co, who, j))
    return true;
  zb_rpc_fail(call, GRPC_STATUS_PERMISSION_DENIED, "job_id: job %s belongs to another user than %s",
              j->row.id, who->name);
  return false;
}

/* The rank suffix of worker_id when it is NAME/RANK for the certificate's
 * NAME (the processes of one torchrun run share a certificate,
 * docs/operations.md, Security): RANK, decimal without leading zeros and
 * at most ZB_TORCH_RANK_MAX (the ranks an agent may bind to), else -1. */
static int shared_cert_rank(const char *name, const char *worker_id) {
  size_t n = strlen(name);
  if (strncmp(worker_id, name, n) != 0 || worker_id[n] != '/')
    return -1;
  const char *digits = worker_id + n + 1;
  size_t len = strspn(digits, "0123456789");
  if (len < 1 || digits[len] || (len > 1 && digits[0] == '0'))
    return -1;
  int rank = 0;
  for (size_t k = 0; k < len; k++) {
    rank = rank * 10 + (digits[k] - '0');
    if (rank > ZB_TORCH_RANK_MAX) /* stops before an int could overflow */
      return -1;
  }
  return rank;
}

bool authz_worker(coord *co, zb_rpc_call *call, const char *worker_id, const char *action) {
  zb_identity who;
  if (!authz_caller(co, call, AUTHZ_WORKER, action, &who))
    return false;
  if (!co->tls || !strcmp(who.name, worker_id ? worker_id : "") ||
      (worker_id && shared_cert_rank(who.name, worker_id) >= 0))
    return true;
  zb_rpc_fail(call, GRPC_STATUS_PERMISSION_DENIED, "worker_id: worker %s may not %s as worker '%.64s'",
              who.name, action, worker_id ? worker_id : "");
  return false;
}

bool authz_torch_rank(coord *co, zb_rpc_call *call, const Zb__V1__AttachRequest *req) {
  if (!co->tls)
    return true;
  zb_identity who;
  zb_rpc_call_identity(call, &who);
  int rank = shared_cert_rank(who.name, req->worker_id);
  if (rank < 0 || (req->torch_run && req->torch_run[0] && req->torch_rank == rank))
    return true;
  zb_rpc_fail(
      call, GRPC_STATUS_PERMISSION_DENIED,
      "worker_id: '%.64s' is the form of a torch agent's rank %d; it must attach with torch_run set and "
      "torch_rank %d",
      req->worker_id, rank, rank);
  return false;
}

void authz_worker_owner(const coord *co, zb_rpc_call *call, const char *worker_id, char *out, size_t cap) {
  if (!co->tls) {
    snprintf(out, cap, "insecure:%s", worker_id);
    return;
  }
  zb_identity who;
  zb_rpc_call_identity(call, &who);
  snprintf(out, cap, "zb://%s/%s", zb_role_name(who.role), who.name);
}
