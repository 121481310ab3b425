/* authz.c — who may do what on the coordinator (docs/operations.md,
 * Security). The caller is who its client certificate says
 * (zb_rpc_call_identity): a worker may only Attach and Report, as the
 * worker id in its certificate; a user may plan, list the workers, and
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

bool authz_worker(coord *co, zb_rpc_call *call, const char *worker_id, const char *action) {
  zb_identity who;
  if (!authz_caller(co, call, AUTHZ_WORKER, action, &who))
    return false;
  if (!co->tls || !strcmp(who.name, worker_id ? worker_id : ""))
    return true;
  zb_rpc_fail(call, GRPC_STATUS_PERMISSION_DENIED, "worker_id: worker %s may not %s as worker '%.64s'",
              who.name, action, worker_id ? worker_id : "");
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
