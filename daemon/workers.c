/* workers.c — the worker registry and liveness: Attach streams (one per
 * worker, carrying its Commands), capabilities, ListWorkers, and the
 * periodic tick that times out silent workers, tells them the heartbeat
 * period when it changes (heartbeat.h), fails jobs whose rank reported a
 * failure and starts pending jobs. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "heartbeat.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_log.h"
#include "zb_names.h"

coord_worker *worker_find(coord *co, const char *id) {
  return zb_strmap_get(&co->worker_index, id);
}

/* Whether name is one of a worker's comma-separated capabilities. */
static bool worker_offers(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0)
      return true;
    p += len + (comma ? 1 : 0);
  }
  return false;
}

/* A torch job's ranks go only to the agents bound to its run, one per
 * rank below its ranks (docs/pytorch.md, Attaching a torchrun job); an
 * agent runs nothing else. */
static bool worker_bound_for(const coord_worker *w, const zb_job_spec *spec) {
  if (strcmp(spec->backend, ZB_BACKEND_TORCH) != 0)
    return !w->torch_run[0];
  return w->torch_run[0] && !strcmp(w->torch_run, spec->torch_run) && w->torch_rank < spec->ranks;
}

bool worker_bound_for_rank(const coord_worker *w, const zb_job_spec *spec, int rank) {
  return worker_bound_for(w, spec) && (!w->torch_run[0] || w->torch_rank == rank);
}

/* An attached worker that offers the job's backend and transport, and for
 * a cuda job has reported a GPU: a worker that offers cuda without naming
 * its device is not trusted with one (docs/operations.md, GPU workers). */
bool worker_offers_job(const coord_worker *w, const zb_job_spec *spec) {
  return w->attach && worker_bound_for(w, spec) && worker_offers(w->backends, spec->backend) &&
         worker_offers(w->transports, spec->transport) && (!job_needs_gpu(spec) || w->gpu[0]);
}

long long worker_memory_for(const coord_worker *w, const zb_job_spec *spec) {
  return job_needs_gpu(spec) ? w->gpu_memory_bytes : w->memory_bytes;
}

/* ... and has the memory its model's fixed state needs on one rank (a
 * worker that advertised none is not judged). */
bool worker_can_run(const coord_worker *w, const zb_job_spec *spec) {
  long long have = worker_memory_for(w, spec);
  return worker_offers_job(w, spec) &&
         (!have || !zb_job_spec_trains_model(spec) || zb_job_spec_rank_state_bytes(spec) <= (double)have);
}

bool job_needs_gpu(const zb_job_spec *spec) {
  return zb_backend_needs_gpu(spec->backend);
}

int workers_with_gpu(coord *co, const zb_job_spec *spec, char *ids, size_t cap) {
  int n = 0;
  ids[0] = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    if (worker_can_run(w, spec)) {
      size_t len = strlen(ids);
      if (n < 8)
        snprintf(ids + len, cap - len, "%s%s", n ? ", " : "", w->id);
      else if (n == 8)
        snprintf(ids + len, cap - len, ", ...");
      n++;
    }
  return n;
}

int workers_idle(coord *co, const zb_job_spec *spec) {
  int n = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    n += worker_can_run(w, spec) && !w->job;
  return n;
}

int workers_attached(coord *co) {
  int n = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    n += w->attach != NULL;
  return n;
}

int workers_able(coord *co, const zb_job_spec *spec) {
  int n = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    n += worker_can_run(w, spec);
  return n;
}

/* A worker's comma-separated capabilities as a repeated field's entries:
 * *items point into *copy; the caller frees both. */
static size_t split_list(const char *list, char **copy, char ***items) {
  size_t n = list[0] ? 1 : 0;
  for (const char *p = list; *p; p++)
    n += *p == ',';
  *copy = zb_malloc(strlen(list) + 1);
  memcpy(*copy, list, strlen(list) + 1);
  *items = zb_calloc(n ? n : 1, sizeof(char *));
  size_t k = 0;
  for (char *p = *copy; n && p; k++) {
    (*items)[k] = p;
    p = strchr(p, ',');
    if (p)
      *p++ = 0;
  }
  return n;
}

void on_list_workers(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  (void)m;
  coord *co = user;
  zb_identity who;
  if (!authz_caller(co, call, AUTHZ_USER | AUTHZ_ADMIN, "list workers", &who))
    return;
  int n = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    n++;
  Zb__V1__Worker *ws = zb_calloc((size_t)(n ? n : 1), sizeof *ws);
  Zb__V1__Worker **ptrs = zb_calloc((size_t)(n ? n : 1), sizeof *ptrs);
  char **copies = zb_calloc((size_t)(n ? n : 1) * 2, sizeof(char *));
  int k = 0;
  for (coord_worker *w = co->workers; w; w = w->next, k++) {
    zb__v1__worker__init(&ws[k]);
    ws[k].id = w->id;
    ws[k].data_address = w->data_address;
    ws[k].n_backends = split_list(w->backends, &copies[2 * k], &ws[k].backends);
    ws[k].n_transports = split_list(w->transports, &copies[2 * k + 1], &ws[k].transports);
    ws[k].gpu = w->gpu;
    ws[k].hostname = w->hostname;
    ws[k].blas = w->blas;
    ws[k].state = w->job ? "busy" : "idle";
    ws[k].job_id = w->job ? w->job->row.id : "";
    ws[k].rank = w->job ? w->rank : -1;
    ws[k].last_seen_unix_ms = w->last_seen_ms;
    ws[k].memory_bytes = w->memory_bytes;
    ws[k].gpu_memory_bytes = w->gpu_memory_bytes;
    ptrs[k] = &ws[k];
  }
  Zb__V1__ListWorkersResponse resp = ZB__V1__LIST_WORKERS_RESPONSE__INIT;
  resp.n_workers = (size_t)n;
  resp.workers = ptrs;
  zb_rpc_reply(call, &resp.base);
  for (k = 0; k < n; k++) {
    free(ws[k].backends);
    free(ws[k].transports);
    free(copies[2 * k]);
    free(copies[2 * k + 1]);
  }
  free(ws);
  free(ptrs);
  free(copies);
}

/* ---- handlers: workers ---- */

static void worker_remove(coord *co, coord_worker *w) {
  coord_worker **pp = &co->workers;
  while (*pp && *pp != w)
    pp = &(*pp)->next;
  if (*pp)
    *pp = w->next;
  zb_strmap_remove(&co->worker_index, w->id);
  free(w);
}

/* A worker is gone (stream closed, heartbeats missed): its job fails. */
static void worker_lost(coord *co, coord_worker *w, const char *why) {
  if (co->stopping) {
    /* Draining cancels every Attach stream: the job is interrupted, not
     * failed by this rank. It stays RUNNING in the store, and the next
     * coordinator marks it as stopped with the coordinator. */
    ZB_INFO("worker %s detached: the coordinator is stopping", w->id);
    if (w->job)
      w->job->ranks[w->rank] = NULL;
    worker_remove(co, w);
    return;
  }
  ZB_WARN("worker %s lost: %s", w->id, why);
  coord_metrics_worker_lost(co);
  if (w->job) {
    char reason[256];
    char who[128];
    job_rank_who(w->job, w, who, sizeof who);
    snprintf(reason, sizeof reason, "%s lost: %s", who, why);
    coord_job *j = w->job;
    job_finish(co, j, ZB_JOB_FAILED, reason);
  }
  worker_remove(co, w);
  coord_start_pending(co);
}

static void attach_closed(zb_rpc_call *call, void *arg) {
  (void)call;
  coord_worker *w = arg;
  w->attach = NULL;
  worker_lost(w->co, w, "its Attach stream closed");
}

static void join_list(char *out, size_t cap, char **items, size_t n) {
  out[0] = 0;
  for (size_t k = 0; k < n; k++) {
    size_t len = strlen(out);
    snprintf(out + len, cap - len, "%s%s", k ? "," : "", items[k]);
  }
}

/* A worker first seen: last in the registry (attach order), and indexed. */
static coord_worker *worker_new(coord *co, const char *id) {
  coord_worker *w = zb_calloc(1, sizeof *w);
  w->co = co;
  snprintf(w->id, sizeof w->id, "%s", id);
  w->rank = -1;
  coord_worker **tail = &co->workers;
  while (*tail)
    tail = &(*tail)->next;
  *tail = w;
  zb_strmap_put(&co->worker_index, w->id, w);
  return w;
}

/* A ping on w's stream with the heartbeat period asked now: the first
 * says it is attached, a later one that the period changed. */
static void worker_ping(coord_worker *w, int64_t now_ms) {
  Zb__V1__Command ping = ZB__V1__COMMAND__INIT;
  ping.kind_case = ZB__V1__COMMAND__KIND_PING_UNIX_MS;
  ping.ping_unix_ms = now_ms;
  ping.heartbeat_ms = w->co->heartbeat_ms;
  w->told_heartbeat_ms = ping.heartbeat_ms;
  zb_rpc_stream_write(w->attach, &ping.base);
}

/* The sizes an AttachRequest advertises are never negative (0: unknown). */
static bool attach_sizes_ok(zb_rpc_call *call, const Zb__V1__AttachRequest *req) {
  const char *names[] = {"max_receive_bytes", "memory_bytes", "gpu_memory_bytes"};
  int64_t values[] = {req->max_receive_bytes, req->memory_bytes, req->gpu_memory_bytes};
  for (int k = 0; k < 3; k++)
    if (values[k] < 0) {
      zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s: %lld is negative", names[k], (long long)values[k]);
      return false;
    }
  return true;
}

/* The AttachRequest's fields: ids and addresses present and in bounds,
 * texts UTF-8, sizes not negative; false after failing call. */
static bool attach_request_ok(zb_rpc_call *call, const Zb__V1__AttachRequest *req) {
  if (!req->worker_id || !req->worker_id[0] || strlen(req->worker_id) >= 64) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "worker_id: required, 1..63 characters");
    return false;
  }
  if (!req->data_address || !req->data_address[0] || strlen(req->data_address) >= 128 ||
      !strrchr(req->data_address, ':')) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "data_address: required, host:port");
    return false;
  }
  const char *texts[] = {req->worker_id, req->data_address,   req->hostname,
                         req->gpu,       req->running_job_id, req->blas};
  const char *names[] = {"worker_id", "data_address", "hostname", "gpu", "running_job_id", "blas"};
  for (int k = 0; k < 6; k++)
    if (!utf8_valid(texts[k])) {
      zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s: not valid UTF-8", names[k]);
      return false;
    }
  for (size_t k = 0; k < req->n_backends + req->n_transports; k++)
    if (!utf8_valid(k < req->n_backends ? req->backends[k] : req->transports[k - req->n_backends])) {
      zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s: not valid UTF-8",
                  k < req->n_backends ? "backends" : "transports");
      return false;
    }
  return attach_sizes_ok(call, req);
}

/* A zb.torch.attach agent's binding (AttachRequest.torch_run, torch_rank):
 * a valid run id and a rank in range, that no other attached worker holds
 * (two processes claiming one rank is a misconfigured launch); false after
 * failing call. */
static bool attach_torch_ok(coord *co, zb_rpc_call *call, const Zb__V1__AttachRequest *req) {
  if (!req->torch_run || !req->torch_run[0]) {
    if (req->torch_rank != 0) {
      zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "torch_rank: %d given without torch_run",
                  req->torch_rank);
      return false;
    }
    return true;
  }
  if (!zb_torch_run_valid(req->torch_run, strlen(req->torch_run) + 1)) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "torch_run: must be 1..63 characters of [A-Za-z0-9._-]");
    return false;
  }
  if (req->torch_rank < 0 || req->torch_rank > ZB_TORCH_RANK_MAX) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "torch_rank: must be in 0..%d, got %d", ZB_TORCH_RANK_MAX,
                req->torch_rank);
    return false;
  }
  for (coord_worker *o = co->workers; o; o = o->next)
    if (o->attach && !strcmp(o->torch_run, req->torch_run) && o->torch_rank == req->torch_rank &&
        strcmp(o->id, req->worker_id) != 0) {
      zb_rpc_fail(call, GRPC_STATUS_ALREADY_EXISTS,
                  "torch_rank: rank %d of run %s is already attached as worker %s", req->torch_rank,
                  req->torch_run, o->id);
      return false;
    }
  return true;
}

static const char *run_name(const char *run) {
  return run && run[0] ? run : "(none)";
}

/* Whether this Attach may take the place of the worker already known by
 * its id: not when that one is attached or runs a job, bound to another
 * torch run. Under TLS a run's agents are NAME/RANK, with no run in the
 * id, so a second run launched with the same certificate names the first
 * run's ids; taken as a restart, it would fail the first run's job
 * (docs/operations.md, Security). False after failing call. */
static bool attach_same_run(coord *co, zb_rpc_call *call, const Zb__V1__AttachRequest *req) {
  const coord_worker *w = worker_find(co, req->worker_id);
  const char *run = req->torch_run ? req->torch_run : "";
  if (!w || (!w->attach && !w->job) || !strcmp(w->torch_run, run))
    return true;
  zb_rpc_fail(call, GRPC_STATUS_ALREADY_EXISTS,
              "worker_id: worker %s is %s%s bound to torch run %s, and this Attach is bound to torch run %s: "
              "two runs share its certificate? (give each concurrent run its own worker certificate)",
              w->id, w->job ? "running job " : "attached", w->job ? w->job->row.id : "",
              run_name(w->torch_run), run_name(run));
  return false;
}

void on_attach(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__AttachRequest *req = (const void *)m;
  if (!authz_worker(co, call, req->worker_id, "attach") || !attach_request_ok(call, req) ||
      !authz_torch_rank(co, call, req) || !attach_torch_ok(co, call, req) || !attach_same_run(co, call, req))
    return;
  if (co->stopping) {
    zb_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "the coordinator is shutting down");
    return;
  }
  char owner[ZB_STORE_OWNER_CAP];
  authz_worker_owner(co, call, req->worker_id, owner, sizeof owner);
  if (!coord_attach_allowed(co, call, owner, req->running_job_id, req->running_rank))
    return;
  coord_worker *w = worker_find(co, req->worker_id);
  if (w) { /* the same worker again (it restarted, or its stream broke) */
    if (w->attach) {
      zb_rpc_call *old = w->attach;
      zb_rpc_call_on_close(old, NULL, NULL);
      w->attach = NULL;
      zb_rpc_stream_finish(old, GRPC_STATUS_ABORTED, "replaced by a new Attach from the same worker");
    }
    if (w->job) {
      char reason[256];
      snprintf(reason, sizeof reason, "rank %d (worker %s) attached again: it restarted", w->rank, w->id);
      job_finish(co, w->job, ZB_JOB_FAILED, reason);
    }
  } else {
    w = worker_new(co, req->worker_id);
  }
  snprintf(w->owner, sizeof w->owner, "%s", owner);
  snprintf(w->data_address, sizeof w->data_address, "%s", req->data_address);
  w->max_receive_bytes = req->max_receive_bytes;
  w->memory_bytes = req->memory_bytes;
  w->gpu_memory_bytes = req->gpu_memory_bytes;
  snprintf(w->hostname, sizeof w->hostname, "%s", req->hostname ? req->hostname : "");
  snprintf(w->gpu, sizeof w->gpu, "%s", req->gpu ? req->gpu : "");
  snprintf(w->blas, sizeof w->blas, "%s", req->blas ? req->blas : "");
  snprintf(w->torch_run, sizeof w->torch_run, "%s", req->torch_run ? req->torch_run : "");
  w->torch_rank = w->torch_run[0] ? req->torch_rank : 0;
  join_list(w->backends, sizeof w->backends, req->backends, req->n_backends);
  join_list(w->transports, sizeof w->transports, req->transports, req->n_transports);
  utf8_trim(w->hostname);
  utf8_trim(w->gpu);
  utf8_trim(w->blas);
  utf8_trim(w->backends);
  utf8_trim(w->transports);
  w->attach = call;
  w->last_seen_ms = zb_clock_unix_ms();
  zb_rpc_call_on_close(call, attach_closed, w);
  ZB_INFO("worker %s attached from %s (data %s)", w->id, zb_rpc_call_peer(call), w->data_address);
  co->heartbeat_ms =
      coord_heartbeat_period(co->cfg.heartbeat_timeout_ms, workers_attached(co), co->heartbeat_ms);
  worker_ping(w, w->last_seen_ms);
  coord_attach_running(co, w, req->running_job_id, req->running_rank);
  coord_start_pending(co);
}

void coord_tick(coord *co) {
  int64_t now = zb_clock_unix_ms();
  coord_store_retry(co);
  /* A tick far behind its period means the loop itself was held (a long
   * plan, a slow disk, a stopped process): the reports that came meanwhile
   * are not read yet, so the stall is not the workers' silence. */
  int64_t stall = co->last_tick_ms ? now - co->last_tick_ms - COORD_TICK_MS : 0;
  co->last_tick_ms = now;
  if (stall > COORD_TICK_MS)
    for (coord_worker *x = co->workers; x; x = x->next)
      x->last_seen_ms = x->last_seen_ms + stall < now ? x->last_seen_ms + stall : now;
  co->heartbeat_ms =
      coord_heartbeat_period(co->cfg.heartbeat_timeout_ms, workers_attached(co), co->heartbeat_ms);
  coord_worker *w = co->workers;
  while (w) {
    coord_worker *next = w->next;
    if (now - w->last_seen_ms > co->cfg.heartbeat_timeout_ms) {
      char why[128];
      snprintf(why, sizeof why, "no heartbeat for %" PRId64 " ms (timeout %d ms)", now - w->last_seen_ms,
               co->cfg.heartbeat_timeout_ms);
      if (w->attach) {
        zb_rpc_call *call = w->attach;
        zb_rpc_call_on_close(call, NULL, NULL);
        w->attach = NULL;
        zb_rpc_stream_finish(call, GRPC_STATUS_UNAVAILABLE, why);
      }
      worker_lost(co, w, why);
    } else if (w->attach && w->told_heartbeat_ms != co->heartbeat_ms) {
      worker_ping(w, now);
    }
    w = next;
  }
  for (coord_job *j = co->jobs; j; j = j->next)
    if (j->row.state == ZB_JOB_RUNNING && j->fail_at_ms && now >= j->fail_at_ms)
      job_finish(co, j, ZB_JOB_FAILED, j->fail_reason);
  coord_start_pending(co);
  coord_recovery_tick(co, now);
  coord_prune_jobs(co, now);
}

void workers_memory_fit(coord *co, const zb_job_spec *spec, double need, int *offer, int *fit,
                        long long *most) {
  *offer = *fit = 0;
  *most = 0;
  for (const coord_worker *w = co->workers; w; w = w->next) {
    if (!worker_offers_job(w, spec))
      continue;
    long long have = worker_memory_for(w, spec);
    (*offer)++;
    *fit += !have || need <= (double)have;
    *most = have > *most ? have : *most;
  }
}
