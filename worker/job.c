/* job.c — the job runner (the job thread): one assignment at a time, with
 * the plan updates that follow it, through the executor over a compute
 * backend and the job's transport, reporting every iteration. The action
 * list it runs is the decoded Assignment's, transport groups included
 * (zb_assignment.h). See worker.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_job.h"
#include "sim_reduce.h"
#include "worker.h"
#include "zb_alloc.h"
#include "zb_device.h"
#include "zb_log.h"
#include "zb_names.h"

#ifdef ZB_WITH_CPU_BACKEND
#define WORKER_BACKENDS "sim and cpu"
#else
#define WORKER_BACKENDS "sim"
#endif

/* What runs one job on this rank, across its plans. */
typedef struct job_state {
  worker *w;
  atomic_bool *stop;
  zb_transport *tr;
  const zb_assignment *a;      /* the plan running now (the first or an update) */
  zb_assignment *owned;        /* an update taken over from the worker */
  cpu_job cj;                  /* a cpu or cuda job's weights and optimizer state, across plans */
  zb_device *dev;              /* a cuda job's device (owned); NULL otherwise */
  struct zb_group_comm *group; /* a cuda job's stage group with data_parallel > 1 (owned); NULL otherwise */
  int next;                    /* the next iteration to run */
  zb_backend *sim;             /* the current plan's sim backend (borrowed); NULL for cpu and cuda */
  sim_reduce sim_reduce;       /* a sim job's REDUCE_GRAD hook (data_parallel > 1) */
} job_state;

/* The backend for one plan of the job: a fresh sim backend (*owned, freed
 * by the caller), or the cpu job's, created on its first plan and kept. */
static zb_err job_backend(job_state *js, zb_backend **be, zb_backend **owned, zb_diag *diag) {
  const zb_assignment *a = js->a;
  *be = *owned = NULL;
  if (zb_backend_runs_model(a->backend)) {
#ifdef ZB_WITH_CPU_BACKEND
    cpu_job *cj = &js->cj;
    zb_err perr = worker_check_model_paths(js->w, &a->model, diag);
    if (perr)
      return perr;
    cj->device = js->dev;
    cj->roots = &js->w->roots;
    cj->host_transport = strcmp(zb_transport_name(js->tr), "nccl") != 0;
    zb_err err = cj->be ? cpu_job_update(cj, a, js->tr, diag) : cpu_job_open(cj, a, js->stop, diag);
    if (!err)
      *be = cj->be;
    return err;
#else
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                       "backend %s: this zb-worker was built without the model (no OpenBLAS)", a->backend);
#endif
  }
  if (a->backend[0] && strcmp(a->backend, ZB_BACKEND_SIM) != 0)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "backend %s: this zb-worker offers %s", a->backend,
                       WORKER_BACKENDS);
  const zb_schedule *sched = a->sched;
  zb_sim_backend_config bc = {.costs = a->costs,
                              .rank_mf =
                                  zb_costs_rank_mf(a->costs, sched->placement, sched->p, sched->v, a->rank),
                              .bytes_per_activation = (size_t)a->bytes_per_activation,
                              .stop = js->stop};
  zb_err err = zb_backend_sim_new(&bc, owned, diag);
  *be = *owned;
  return err;
}

/* Connects the transport to the ranks this plan exchanges tensors with
 * and, for a model job or one with replicas (the stage group's ring
 * neighbours), to every rank the coordinator sent an address for
 * (rank +-1: the optimizer's global check runs along the ranks,
 * zb_step_reduce_chain; the other end of a tied head; every rank at an
 * update that moves stages). Connect is additive: known peers are
 * skipped. */
static zb_err job_connect(job_state *js, zb_diag *diag) {
  const zb_assignment *a = js->a;
  const zb_rank_list *l = &a->sched->ranks[a->rank];
  int world = zb_assignment_world(a), base = a->replica * a->ranks, me = zb_assignment_global(a);
  /* the plan's peers, then as transport (global) ranks of this replica */
  bool *plan_peers = zb_calloc((size_t)a->ranks, sizeof(bool));
  zb_executor_peers(l->actions, l->n, a->ranks, plan_peers);
  bool *peers = zb_calloc((size_t)world, sizeof(bool));
  for (int q = 0; q < a->ranks; q++)
    peers[base + q] = plan_peers[q];
  free(plan_peers);
  if (zb_backend_runs_model(a->backend)) { /* the step chain runs within the replica */
    if (a->rank > 0)
      peers[me - 1] = true;
    if (a->rank + 1 < a->ranks)
      peers[me + 1] = true;
  }
  if (zb_backend_runs_model(a->backend) || a->data_parallel > 1) /* and the stage group's ring */
    for (int q = 0; q < world; q++)
      peers[q] = peers[q] || (q != me && zb_assignment_peer(a, q));
  const char **addrs = zb_calloc((size_t)world, sizeof(char *));
  for (int q = 0; q < world; q++) {
    addrs[q] = zb_assignment_peer(a, q);
    if (peers[q] && !addrs[q]) {
      free(addrs);
      free(peers);
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment: no data address for peer rank %d", q);
    }
  }
  zb_err err = zb_transport_connect(js->tr, addrs, peers, 30, diag);
  free(addrs);
  free(peers);
  return err;
}

/* Runs one iteration: for a cpu job, begin_iteration before it and the
 * optimizer step after it (*stepped says the step ran and fills *step). */
static zb_err job_iteration(job_state *js, zb_executor *ex, zb_rank_iteration *it, bool *has_loss,
                            double *loss, bool *stepped, zb_step_result *step, zb_diag *diag) {
  *has_loss = false;
  *stepped = false;
  zb_err err = ZB_OK;
#ifdef ZB_WITH_CPU_BACKEND
  cpu_job *cj = &js->cj;
  if (cj->be)
    err = zb_backend_cpu_begin_iteration(cj->be, js->next, diag);
  if (!err)
    err = zb_executor_run_iteration(ex, js->next, it, diag);
  if (!err && cj->be) {
    err = cpu_job_step(cj, js->tr, js->next, has_loss, loss, step, diag);
    *stepped = !err;
  }
#else
  (void)loss;
  (void)step;
  err = zb_executor_run_iteration(ex, js->next, it, diag);
#endif
  return err;
}

/* The test knob's slowdown of sim ops for iteration `it` (1: none). */
static double sim_scale(const worker *w, int it) {
  return w->sim_slowdown > 0 && it >= w->sim_slowdown_from ? w->sim_slowdown : 1.0;
}

/* After an iteration's step: a cpu job's periodic checkpoint, written
 * before the report, so a reported iteration N-1, 2N-1, ... is on disk;
 * and one after the last iteration, the final model. */
static zb_err job_after_step(job_state *js, zb_diag *diag) {
#ifdef ZB_WITH_CPU_BACKEND
  cpu_job *cj = &js->cj;
  cj->completed = js->next;
  if (cj->ckpt_every > 0 && ((js->next + 1) % cj->ckpt_every == 0 || js->next + 1 == js->a->iterations))
    return cpu_job_save(cj, js->next, diag);
#else
  (void)js;
  (void)diag;
#endif
  return ZB_OK;
}

/* Runs the current plan's iterations until the job ends, the coordinator
 * says stop, or an update takes over. */
static zb_err job_run_plan(job_state *js, zb_executor *ex, zb_diag *diag) {
  const zb_assignment *a = js->a;
  ZB_INFO("job %s rank %d: %s, iterations %d..%d", a->job_id, a->rank, a->schedule, js->next + 1,
          a->iterations);
  job_run jr = {.w = js->w, .a = a, .plan_version = a->plan_version};
  zb_err err = ZB_OK;
  bool go_on = true;
  /* one iteration at a time: a cpu job steps its optimizer between them */
  while (go_on && js->next < a->iterations && !atomic_load(js->stop)) {
    zb_rank_iteration it;
    bool has_loss, stepped;
    double loss = 0;
    zb_step_result step;
    if (js->sim)
      zb_backend_sim_set_time_scale(js->sim, sim_scale(js->w, js->next));
    if ((err = job_iteration(js, ex, &it, &has_loss, &loss, &stepped, &step, diag)))
      break;
    if (has_loss)
      ZB_DEBUG("job %s iteration %d: loss %.6f", a->job_id, js->next, loss);
    if (stepped && (step.skipped || step.clipped))
      ZB_DEBUG("job %s rank %d iteration %d: grad norm %g, step %s", a->job_id, a->rank, js->next,
               step.grad_norm, step.skipped ? "skipped (non-finite)" : "clipped");
    ZB_DEBUG("job %s rank %d iteration %d: %d comm groups, %d sends and receives", a->job_id, a->rank,
             js->next, it.comm_groups, it.comm_actions);
    if (stepped && (err = job_after_step(js, diag)))
      break;
    js->next++;
    go_on = report_iteration(&jr, &it, has_loss, loss, stepped ? &step : NULL);
  }
  if (!err && jr.lost[0])
    err = zb_diag_set(diag, ZB_ERR_IO, "%s", jr.lost);
  return err;
}

/* A resumed cpu job's first plan loads the checkpoint and starts after it. */
static zb_err job_resume(job_state *js, zb_diag *diag) {
#ifdef ZB_WITH_CPU_BACKEND
  cpu_job *cj = &js->cj;
  if (!cj->be || !cj->resume_from[0])
    return ZB_OK;
  int k = -1;
  zb_err err = cpu_job_resume(cj, js->tr, &k, diag);
  if (err)
    return err;
  if (k + 1 >= js->a->iterations)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "resume: the checkpoint is after iteration %d, the job's last: nothing to run", k);
  js->next = k + 1;
#else
  (void)js;
  (void)diag;
#endif
  return ZB_OK;
}

/* Connects, builds the backend and executor of the current plan, and runs it. */
static zb_err job_plan_run(job_state *js, zb_diag *diag) {
  const zb_assignment *a = js->a;
  const zb_rank_list *l = &a->sched->ranks[a->rank];
  zb_backend *be = NULL, *sim = NULL;
  zb_executor *ex = NULL;
  /* before anything is allocated: a rank this worker cannot hold fails
   * naming both figures rather than aborting it */
  zb_err err = worker_admit(js->w, a, diag);
  if (!err)
    err = job_connect(js, diag);
  /* after the p2p connect, once per job: every rank joins the job's
   * communicator, then its stage group's (its pipeline rank is kept
   * across plans, so the group is too) */
  if (!err && js->dev && a->data_parallel > 1 && !js->group)
    err = worker_group_comm(js->w, a, js->dev, js->stop, &js->group, diag);
  if (!err)
    err = job_backend(js, &be, &sim, diag);
  js->sim = sim;
  zb_executor_config ec = {.rank = a->rank,
                           .nranks = a->ranks,
                           .peer_base = a->replica * a->ranks,
                           .actions = l->actions,
                           .n_actions = l->n,
                           .costs = a->costs,
                           .bytes_per_activation = (size_t)a->bytes_per_activation,
                           .stop = js->stop,
                           .trace_every = a->trace_every};
#ifdef ZB_WITH_CPU_BACKEND
  if (js->cj.be && js->cj.data_parallel > 1) { /* REDUCE_GRAD: the replicas' gradient reduction */
    js->cj.tr = js->tr;
    js->cj.group_comm = js->group; /* a cuda job's; NULL: the ring over tr */
    ec.reduce = cpu_job_reduce_stage;
    ec.reduce_wait = cpu_job_reduce_wait;
    ec.reduce_abort = cpu_job_reduce_abort;
    ec.reduce_ud = &js->cj;
  }
#endif
  if (sim && a->data_parallel > 1) { /* REDUCE_GRAD: the replicas meet, then the cost model's time */
    js->sim_reduce = (sim_reduce){.tr = js->tr,
                                  .sim = sim,
                                  .rank = a->rank,
                                  .ranks = a->ranks,
                                  .replica = a->replica,
                                  .data_parallel = a->data_parallel};
    ec.reduce = sim_reduce_stage;
    ec.reduce_ud = &js->sim_reduce;
  }
  if (!err)
    err = zb_executor_new(&ec, be, js->tr, &ex, diag);
  if (!err)
    err = job_resume(js, diag);
  if (!err)
    err = job_run_plan(js, ex, diag);
  zb_executor_free(ex);
  js->sim = NULL;
  zb_backend_free(sim);
  return err;
}

/* Takes over the plan update that starts at js->next. */
static zb_err job_take_update(job_state *js, zb_diag *diag) {
  worker *w = js->w;
  pthread_mutex_lock(&w->mu);
  zb_assignment *u = w->update;
  w->update = NULL;
  pthread_mutex_unlock(&w->mu);
  if (!u || u->first_iteration != js->next) {
    worker_assignment_free(u);
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "stopped at iteration %d for a plan update that is not there", js->next);
  }
  worker_assignment_free(js->owned);
  js->owned = u;
  js->a = u;
  return ZB_OK;
}

static uint64_t job_session(const char *job_id) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a: both ends derive the same */
  for (const char *p = job_id; *p; p++)
    h = (h ^ (uint8_t)*p) * 1099511628211ULL;
  return h;
}

/* Runs one assignment (and the updates that follow) to its end. Returns
 * an error message in diag when the rank failed (not when stopped). */
/* The job's transport: nccl (through the coordinator's id exchange), or
 * tcp on the worker's data address. */
static zb_err job_transport(job_state *js, const zb_assignment *first, atomic_bool *stop, zb_diag *diag) {
  if (strcmp(first->transport, "nccl") == 0)
    return worker_nccl_transport(js->w, first, js->dev, stop, &js->tr, diag);
  zb_tcp_config tc = {.rank = zb_assignment_global(first), /* the transport spans every replica */
                      .nranks = zb_assignment_world(first),
                      .has_listener = true,
                      .listener_fd = js->w->data_fd,
                      .session = job_session(first->job_id),
                      .secret = first->has_data_secret ? first->data_secret : NULL,
                      .secret_len = first->has_data_secret ? sizeof first->data_secret : 0,
                      .stop = stop,
                      .idle_timeout_s = 30};
  return zb_transport_tcp_new(&tc, &js->tr, diag);
}

/* Runs one assignment (and the updates that follow) to its end. Returns
 * an error message in diag when the rank failed (not when stopped). */
static zb_err job_execute(worker *w, const zb_assignment *first, atomic_bool *stop, bool *from_peer,
                          zb_diag *diag) {
  job_state js = {.w = w, .stop = stop, .a = first, .next = first->first_iteration};
  /* admitted before the device takes its workspace (admit.c); the device
   * next: an nccl transport orders its stream after the device's */
  zb_err err = worker_admit(w, first, diag);
  if (!err)
    err = worker_cuda_device(w, first, &js.dev, diag);
  if (!err)
    err = job_transport(&js, first, stop, diag);
  while (!err && js.next < js.a->iterations && !atomic_load(stop)) {
    err = job_plan_run(&js, diag);
    if (err || js.next >= js.a->iterations || atomic_load(stop))
      break;
    err = job_take_update(&js, diag); /* stopped early for an update */
  }
#ifdef ZB_WITH_CPU_BACKEND
  /* cancelled, released or failed before the end: keep the last completed
   * iteration, so a resume loses at most the one in flight */
  cpu_job *cj = &js.cj;
  if (cj->be && cj->ckpt_every > 0 && js.next < js.a->iterations && cj->completed >= 0 && !cj->torn) {
    zb_diag sd = {{0}};
    if (cpu_job_save(cj, cj->completed, &sd))
      ZB_ERROR("job %s rank %d: %s", cj->job_id, cj->rank, sd.msg);
  }
  cpu_job_close(cj);
#endif
  worker_assignment_free(js.owned);
  *from_peer = err && js.tr && zb_transport_failed_by_peer(js.tr);
  if (js.tr && err)
    zb_transport_abort(js.tr, diag->msg); /* peers blocked on this rank fail now */
  /* and the stage group's members; a stopped job's too, whose members
   * may be lost: destroying a communicator waits for them, aborting not */
  worker_group_comm_end(js.group, err ? diag->msg : atomic_load(stop) ? "the job was stopped" : NULL);
  zb_transport_free(js.tr);
  zb_device_free(js.dev);
  return err;
}

/* Waits for the next assignment; NULL when the worker shuts down. */
static zb_assignment *job_wait(worker *w, atomic_bool *stop) {
  pthread_mutex_lock(&w->mu);
  while (!w->next_job && !atomic_load(&w->shutdown))
    pthread_cond_wait(&w->cv, &w->mu);
  zb_assignment *a = w->next_job;
  w->next_job = NULL;
  if (a) {
    w->job_stop = stop;
    snprintf(w->running_job, sizeof w->running_job, "%s", a->job_id);
    w->running_rank = zb_assignment_global(a); /* the coordinator's ranks are global */
  }
  pthread_mutex_unlock(&w->mu);
  if (a)
    worker_report_forget(w);
  return a;
}

void *job_thread(void *arg) {
  worker *w = arg;
  for (;;) {
    atomic_bool stop = false;
    zb_assignment *a = job_wait(w, &stop);
    if (!a)
      return NULL;
    zb_diag d = {{0}};
    bool from_peer = false;
    zb_err err = job_execute(w, a, &stop, &from_peer, &d);
    bool stopped = atomic_load(&stop);
    if (err && !stopped) {
      ZB_ERROR("job %s rank %d failed: %s", a->job_id, a->rank, d.msg);
      worker_report_end(w, a->job_id, zb_assignment_global(a), d.msg, from_peer);
    } else if (!err && !stopped) {
      worker_report_end(w, a->job_id, zb_assignment_global(a), NULL, false);
      ZB_INFO("job %s rank %d: done", a->job_id, a->rank);
    } else {
      ZB_INFO("job %s rank %d: stopped", a->job_id, a->rank);
    }
    worker_report_forget(w);
    pthread_mutex_lock(&w->mu);
    w->job_stop = NULL;
    w->running_job[0] = 0;
    worker_assignment_free(w->update);
    w->update = NULL;
    pthread_mutex_unlock(&w->mu);
    worker_assignment_free(a);
  }
}
