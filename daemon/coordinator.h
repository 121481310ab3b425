/* coordinator.h — zb-coordinator's state and the files that share it,
 * divided the way its work is (docs/architecture.md, Processes):
 *   rpc.c        the RPC table: every method and its handler;
 *   job_core.c   the lifecycle's rules, below this header (job_core.h:
 *                no RPC, no loop; unit-tested against in-memory SQLite);
 *   jobs.c       jobs and their lifecycle, events, the store;
 *   job_rpc.c    the users' job RPCs (submit, get, list, cancel, iteration);
 *   watch.c      WatchJob streams, bounded in bytes and per identity;
 *   admission.c  the one admission check of a plan, and the Plan RPC;
 *   dispatch.c   starting jobs, Assignments, releases, schedule updates;
 *   workers.c    the worker registry, Attach streams, liveness, the tick;
 *   reports.c    gathering Reports into per-iteration events;
 *   retention.c  pruning finished jobs;
 *   metrics.c    the Prometheus endpoint;  process.c  fd budget, process_*;
 *   main.c       flags, config, the loop.
 * Everything here is owned by the one libuv loop thread; only the metrics
 * text crosses to libmicrohttpd's thread, under a lock.
 */
#ifndef ZB_COORDINATOR_H
#define ZB_COORDINATOR_H

#include <pthread.h>
#include <stdint.h>
#include <uv.h>

#include "coord_config.h"
#include "job_core.h"
#include "zb/v1/zb.pb-c.h"
#include "zb_assignment.h"
#include "zb_buf.h"
#include "zb_clock.h"
#include "zb_job_plan.h"
#include "zb_rpc.h"
#include "zb_store.h"
#include "zb_strmap.h"
#include "zb_timeline.h"
#include "zb_utf8.h"
#include "zb_wire.h"

typedef struct coord coord;
typedef struct coord_job coord_job;

typedef struct coord_worker {
  coord *co;
  char id[64];
  char data_address[128];
  char hostname[64];
  char gpu[256];                     /* AttachRequest.gpu, whole: the stand-in mark must survive */
  char blas[128];                    /* AttachRequest.blas: its cpu backend's CBLAS; "" if not said */
  char backends[64], transports[64]; /* comma-separated */
  long long max_receive_bytes;       /* its gRPC receive limit (AttachRequest) */
  long long memory_bytes;            /* host memory for cpu jobs; 0: not advertised */
  long long gpu_memory_bytes;        /* its GPU's, for cuda jobs; 0: none or not advertised */
  zb_rpc_call *attach;               /* the Attach stream; NULL when detached */
  char owner[ZB_STORE_OWNER_CAP];    /* who it is, as a rank's owner is kept (authz_worker_owner) */
  int64_t last_seen_ms;
  int told_heartbeat_ms; /* the heartbeat period its stream last carried (heartbeat.h) */
  coord_job *job;        /* NULL: idle */
  int rank;              /* the global rank it runs */
  /* a zb.torch.attach agent: the torchrun run and rank it is bound to
   * (AttachRequest.torch_run, torch_rank); "" for any other worker */
  char torch_run[64];
  int torch_rank;
  struct coord_worker *next;
} coord_worker;

/* What the ranks reported for one iteration, until all p are in. */
typedef struct coord_iter_slot {
  int iteration; /* -1: free */
  int n;
  bool *have;
  Zb__V1__RankIteration *ranks;
  char schedule[32];
  double predicted, predicted_paper;
  int loss_rank; /* the rank hosting the last stage of a cpu job's plan; -1: no loss */
} coord_iter_slot;

enum { COORD_ITER_SLOTS = 8 };

/* A WatchJob stream (watch.c): replaying the stored events a page at a
 * time as the client reads (after: the last seq queued), then live. What
 * it holds is bounded in bytes (max_watch_bytes_per_stream, and
 * max_watch_bytes_total for all of them): one that falls behind past
 * either is cut, naming the seq to resume after (docs/wire.md, WatchJob). */
typedef struct coord_watcher {
  zb_rpc_call *call;
  coord *co;
  coord_job *job;
  int64_t after;
  int64_t from; /* the request's after_seq: where a stream cut before any event resumes */
  bool live;
  struct coord_watcher *next;
} coord_watcher;

/* Stored events read for a replaying watcher at a time, at most (and at
 * most its byte budget of them). */
enum { COORD_WATCH_PAGE = 32 };

/* One identity's WatchJob streams (watch.c): a certificate's ROLE/NAME, or
 * in insecure mode the client's host; counted against
 * max_streams_per_identity from the stream's start until the server frees
 * it (a stream cut while its last message waits for the client still
 * counts). */
typedef struct coord_stream_owner {
  char key[96];
  zb_rpc_account acct; /* its parent: coord.watch_acct */
  struct coord_stream_owner *next;
} coord_stream_owner;

struct coord_job {
  zb_store_job row; /* what the store keeps (row.spec / row.last owned here) */
  zb_job_spec spec;
  /* while RUNNING */
  /* plan: made at submission for admission, kept if the job starts then;
   * a job that waits PENDING holds none (its plan is made again when
   * workers are there, start_planning meanwhile): waiting jobs cost no
   * plan memory. next_plan: an update waiting for switch_at */
  zb_planner_result plan, next_plan;
  int plan_version, switch_at;
  coord_worker **ranks; /* data_parallel x p workers, by global rank (zb_jobspec_dp.h) */
  int done_ranks;
  bool *rank_done;
  /* the next iteration to complete, in order; -1 until one has (a resumed
   * job starts past 0): then the lowest slot in use is next */
  int next_iteration;
  coord_iter_slot slots[COORD_ITER_SLOTS];
  int max_reported; /* highest iteration any rank reported */
  double samples_per_second;
  coord_watcher *watchers;
  /* a rank's reported failure, held until fail_at_ms (0: none) in case a
   * lost worker of the job caused it, or (fail_from_peer: the rank only saw
   * a peer close its connection) another rank reports its own */
  int64_t fail_at_ms;
  char fail_reason[256];
  bool fail_from_peer;
  /* an nccl job's bootstrap id, from rank 0's Report (memory only: a
   * coordinator restart fails the running jobs anyway) */
  bool has_nccl_id;
  uint8_t nccl_id[ZB_NCCL_ID_BYTES];
  /* with data_parallel > 1: each stage group's id, by pipeline rank (p
   * entries, allocated at the first; NULL before), from its member 0 */
  uint8_t (*group_ids)[ZB_NCCL_ID_BYTES];
  bool *has_group_id;
  /* the data-plane secret its ranks' handshakes prove (random, made when
   * the job is queued; memory only, like the plan) */
  uint8_t data_secret[ZB_DATA_SECRET_BYTES];
  /* costs learned from sampled iterations (learn.c); NULL before the
   * first (memory only, like the plan) */
  zb_costs *learned;
  int learned_iterations;
  double *slowdown;       /* by rank, from the last sampled iteration (NULL before one) */
  bool dirty;             /* its row's last write failed (a full disk): retried each tick */
  bool updating;          /* an UpdateSchedule plan is being made for it (plan_async.c) */
  bool start_planning;    /* its plan is being made to start it (dispatch.c) */
  bool metrics_forgotten; /* its series left /metrics (metrics_text.c) */
  /* its op-duration histograms, by rank x op (metrics.c), from its first
   * sampled iteration until its series leave /metrics (NULL otherwise) */
  struct op_hist *op_hists;
  char (*rank_hosts)[64];   /* by global rank once started: its worker's host (Job.rank_hosts) */
  char (*rank_workers)[64]; /* by global rank once started: its worker's id (Job.rank_workers) */
  /* taken back after a coordinator restart (recovery.c): until
   * recover_until_ms (0: every rank is back) its ranks' workers may attach
   * again naming it; its schedule stays (the data secret is gone) */
  bool recovered;
  int64_t recover_until_ms;
  bool spec_unreadable; /* its stored spec did not decode at load: it never runs again */
  struct coord_job *next;
  struct coord_job *next_planning; /* in coord.planning while its submit is planned */
};

struct coord {
  uv_loop_t *loop;
  zb_coord_config cfg;
  const char *config_path; /* for SIGHUP */
  /* given as flags, which win over the file at every reload too */
  bool heartbeat_flag, log_level_flag;
  zb_store *store;
  zb_tls *tls; /* NULL: insecure mode */
  /* a store write failed and some row is not written yet: Health answers
   * NOT_SERVING and submissions are refused until it is */
  bool store_failing;
  zb_rpc_server *rpc;
  int grpc_port, metrics_port;
  coord_job *jobs;     /* oldest first */
  coord_job *planning; /* submitted, their plans being made off the loop (not yet in jobs) */
  /* plan_async.c: identities with plans queued or running, in
   * round-robin order; the plans on the pool now */
  struct coord_plan_owner *plan_owners;
  int plans_running;
  coord_worker *workers;
  /* the same jobs and workers by id (job_find, worker_find: every Report
   * looks both up); entries are added and removed with the lists' */
  zb_strmap job_index, worker_index;
  int heartbeat_ms;                      /* the period asked of workers now (heartbeat.h) */
  int64_t next_job_number;               /* the next job id's number: 64-bit, never repeats */
  int64_t last_prune_ms;                 /* retention.c */
  int64_t watchdog_ms, last_watchdog_ms; /* systemd's WatchdogSec (0: none), main.c */
  long long jobs_pruned;                 /* finished jobs retention removed since start */
  uv_timer_t tick;
  int64_t last_tick_ms; /* when coord_tick last ran (the tick timer's start before the first) */
  uv_signal_t sigterm, sigint, sighup;
  bool stopping;
  /* WatchJob streams (watch.c): every one's bytes and count, each
   * identity's, and those cut for falling behind (by their own budget, by
   * the total) */
  zb_rpc_account watch_acct;
  coord_stream_owner *stream_owners;
  long long watch_cut_behind, watch_cut_total;
  /* metrics: counters the loop keeps, the text libmicrohttpd serves */
  struct coord_metrics *metrics;
};

/* The period of coord_tick. */
enum { COORD_TICK_MS = 250 };
/* How long a rank's reported failure waits for the loss of a worker of the
 * same job, which is the better reason: a killed worker's neighbours see
 * its connections close about when the coordinator sees its stream close. */
enum { COORD_FAIL_GRACE_MS = 500 };

/* A worker that does not say its receive limit (an older one) had this
 * one built in. */
enum { COORD_OLD_WORKER_RECEIVE_BYTES = 64 << 20 };

/* authz.c: each false after failing call (UNAUTHENTICATED or
 * PERMISSION_DENIED). Roles as bits of authz_caller's mask. */
enum {
  AUTHZ_WORKER = 1u << ZB_ROLE_WORKER,
  AUTHZ_USER = 1u << ZB_ROLE_USER,
  AUTHZ_ADMIN = 1u << ZB_ROLE_ADMIN
};
/* The caller into *who; true when its role is in roles (action: what it
 * asked to do, for the message). */
bool authz_caller(coord *co, zb_rpc_call *call, unsigned roles, const char *action, zb_identity *who);
/* Whether who may act on (and see) job j: an admin, or the user who owns
 * it; everyone in insecure mode. */
bool authz_owns(const coord *co, const zb_identity *who, const coord_job *j);
/* authz_owns, failing call with PERMISSION_DENIED when not. */
bool authz_job(coord *co, zb_rpc_call *call, const zb_identity *who, const coord_job *j);
/* Whether the caller is the worker worker_id (Attach, Report). */
bool authz_worker(coord *co, zb_rpc_call *call, const char *worker_id, const char *action);
/* With mutual TLS, a worker id of the form NAME/RANK (NAME the
 * certificate's) must belong to a torch agent bound to rank RANK
 * (AttachRequest.torch_run set, torch_rank RANK); false after failing call
 * with PERMISSION_DENIED. */
bool authz_torch_rank(coord *co, zb_rpc_call *call, const Zb__V1__AttachRequest *req);
/* The identity a worker's ranks are kept under (zb_store_job.rank_owners):
 * with mutual TLS its certificate's, "zb://worker/NAME"; in insecure mode,
 * which has no identities, "insecure:" and the worker id it claims. */
void authz_worker_owner(const coord *co, zb_rpc_call *call, const char *worker_id, char *out, size_t cap);

/* rpc.c */
extern const zb_rpc_method coord_methods[];
extern const int coord_n_methods;

/* jobs.c */
/* Loads jobs from the store (marking interrupted ones failed). */
zb_err coord_load(coord *co, zb_diag *diag);
/* Frees one job that is off the list and that nothing points at. */
void job_free(coord_job *j);
/* Frees jobs, workers and watchers (after the RPC server is gone). */
void coord_free_state(coord *co);
coord_job *job_find(coord *co, const char *id);
/* The job named by a request's job_id, or NULL after failing call. */
coord_job *job_lookup(coord *co, zb_rpc_call *call, const char *id);
/* How messages name the rank worker w runs: "rank 3 (worker W)", and with
 * data_parallel > 1 "rank 3 (replica 1, stage 1, worker W)", stage being
 * the pipeline rank (docs/formats.md, Data parallelism). */
void job_rank_who(const coord_job *j, const coord_worker *w, char *out, size_t cap);
/* Fills j->data_secret with fresh random bytes (the kernel's). */
void job_new_data_secret(coord_job *j);
bool job_terminal(const coord_job *j);
/* Records an event (state, reason, optional iteration), persists the job
 * and sends the event to every watcher. False when the store refused a
 * write (the job is then marked dirty, the coordinator NOT_SERVING until
 * coord_store_retry gets it written; diag says why). */
bool job_event(coord *co, coord_job *j, const Zb__V1__IterationMetrics *it, zb_diag *diag);
/* Writes the rows the store refused before (each tick while it fails);
 * the coordinator serves again once they are all in. */
void coord_store_retry(coord *co);
/* Moves a job to a final state: releases its workers, ends its watchers'
 * streams. */
void job_finish(coord *co, coord_job *j, int state, const char *reason);
/* Fills out from j; release with job_pb_clear. */
void job_pb(const coord_job *j, Zb__V1__Job *out);
void job_pb_clear(Zb__V1__Job *pb);
bool utf8_valid(const char *s);
/* Drops what a truncating snprintf left of a multi-byte character. */
void utf8_trim(char *s);

/* job_rpc.c */
void on_submit(zb_rpc_call *call, const ProtobufCMessage *m, void *user);
void on_get_job(zb_rpc_call *call, const ProtobufCMessage *m, void *user);
void on_list_jobs(zb_rpc_call *call, const ProtobufCMessage *m, void *user);
void on_cancel(zb_rpc_call *call, const ProtobufCMessage *m, void *user);
/* GetIteration: one completed iteration's figures, timelines included, from the store. */
void on_get_iteration(zb_rpc_call *call, const ProtobufCMessage *m, void *user);

/* watch.c: WatchJob streams (docs/wire.md, WatchJob) */
void on_watch(zb_rpc_call *call, const ProtobufCMessage *m, void *user);
/* Sends ev, j's newest event, to j's live watchers (job_event), cutting
 * those whose budget it does not fit. */
void watch_send_live(coord_job *j, const Zb__V1__JobEvent *ev);
/* The job ended: its watchers' streams end (OK) once their clients have
 * read all. */
void watch_end_live(coord_job *j);
/* Frees j's watchers (at exit, after the RPC server is gone). */
void watch_free_all(coord_job *j);
/* Frees the stream owners (at exit, after the RPC server is gone). */
void watch_free_owners(coord *co);

/* plan_async.c: a plan made off the loop, queued per identity and served
 * round-robin (max_concurrent_plans, max_concurrent_plans_per_identity).
 * The caller fills co, call (NULL: no caller waits, say a job's start),
 * owner (the identity it is planned for), spec, objective, plan (both its
 * own, alive until done), what (the field prefix errors name, "spec." or
 * "") and done, then calls coord_plan_off_loop, which answers the call
 * when the coordinator is stopping (UNAVAILABLE) or the planner refused
 * the spec (INVALID_ARGUMENT); done then runs on the loop with op->call
 * NULL (the client left, or was answered), or with the call still to
 * answer; op->cancelled when no plan was made (the client left while it
 * was queued, or the coordinator stops), op->err when planning failed.
 * done owns op and *plan from then on. */
typedef struct coord_plan_op {
  uv_work_t req;
  coord *co;
  zb_rpc_call *call;
  char owner[64];
  const zb_job_spec *spec;
  zb_objective objective;
  zb_planner_result *plan;
  const char *what;
  zb_err err;
  zb_diag diag;
  bool queued, cancelled;
  struct coord_plan_op *next_queued;
  /* optional: more work on the pool thread after a plan made (say, its
   * answer built), touching nothing but the op */
  void (*then)(struct coord_plan_op *op);
  void (*done)(struct coord_plan_op *op);
} coord_plan_op;
/* One identity's plans: those waiting for a planner, in order, and how
 * many of its plans are being made. */
typedef struct coord_plan_owner {
  char name[64];
  coord_plan_op *head, *tail;
  int running;
  struct coord_plan_owner *next;
} coord_plan_owner;
void coord_plan_off_loop(coord_plan_op *op);
/* Ends every queued plan (done with cancelled set) at shutdown. */
void coord_plans_drop_queued(coord *co);

/* admission.c */
/* Admission of a plan (what: "spec." or "", the prefix of the field
 * errors name), in two halves around the plan made off the loop: the
 * checks before planning (the planning budget, max_plan_ops, and the lower
 * bound on the plan's size), and those of the plan made: every rank's
 * Assignment within the coordinator's max_message_bytes and the receive
 * limit of every attached worker able to run it (*plan freed on refusal).
 * On refusal they fail call (RESOURCE_EXHAUSTED naming the limit) and
 * return false. */
bool coord_admit_before_plan(coord *co, zb_rpc_call *call, const zb_job_spec *spec, const char *what);
bool coord_admit_planned(coord *co, zb_rpc_call *call, coord_job *j, const zb_job_spec *spec,
                         const char *what, zb_planner_result *plan);
/* The plan's memory against the workers': RESOURCE_EXHAUSTED (naming the
 * rank, what it needs and the most a worker has) when fewer workers able
 * to run a model job have the bytes its neediest rank takes, state and
 * live activations at its peak, than it has ranks. */
bool coord_admit_activations(coord *co, zb_rpc_call *call, const zb_job_spec *spec,
                             const zb_planner_result *plan);
/* The largest Assignment workers ws (n of them) can all receive, and the
 * first worker that sets it (NULL: the coordinator's own limit). */
long long coord_assignment_limit(coord *co, coord_worker *const *ws, int n, const coord_worker **by);
void on_plan(zb_rpc_call *call, const ProtobufCMessage *m, void *user);

/* dispatch.c */
/* Starts pending jobs, oldest first, while enough workers are idle. */
void coord_start_pending(coord *co);
void job_release_workers(coord_job *j);
/* The Assignment source of j's plan (version, first iteration); its
 * address table is allocated when j has ranks (free it). */
zb_assignment_src job_assignment_src(coord_job *j, const zb_planner_result *plan, int version, int first);
void on_update_schedule(zb_rpc_call *call, const ProtobufCMessage *m, void *user);
/* Makes plan (taken over; *plan is left empty) the job's next one from
 * iteration at: sends every rank its assignment (the next plan version);
 * the switch completes when iteration at is in (reports.c). */
void job_switch_plan(coord_job *j, zb_planner_result *plan, int at);
/* Sends j's NCCL id (has_nccl_id) to every rank as Command.nccl_id. */
void job_send_nccl_id(coord_job *j);
/* Sends the id of pipeline rank r's stage group (has_group_id[r]) to the
 * group's d members as Command.nccl_id with stage_group set. */
void job_send_group_id(coord_job *j, int r);

/* workers.c */
/* Periodic work: heartbeat timeouts, the heartbeat period asked of the
 * workers, deferred rank failures, pending jobs, recovery, retention. */
void coord_tick(coord *co);
coord_worker *worker_find(coord *co, const char *id);
/* An attached worker that offers the job's backend and transport (and a
 * GPU, for a job that needs one). */
bool worker_offers_job(const coord_worker *w, const zb_job_spec *spec);
/* Whether w's torch binding lets it run rank of a job of spec: a torch
 * job's rank r only on the agent bound to (spec->torch_run, r), any other
 * job's only on a worker bound to no run (docs/pytorch.md). */
bool worker_bound_for_rank(const coord_worker *w, const zb_job_spec *spec, int rank);
/* The memory a worker advertised for spec's kind of job (GPU or host). */
long long worker_memory_for(const coord_worker *w, const zb_job_spec *spec);
/* One that offers it and has the memory the model's fixed state needs on
 * a rank (zb_job_spec_rank_state_bytes), when it advertised any: the
 * workers admission counts and jobs start on. */
bool worker_can_run(const coord_worker *w, const zb_job_spec *spec);

/* placement.c */
/* Gives j's data_parallel x ranks global ranks to idle able workers
 * (enough are idle: the caller checked), filling j->ranks and
 * j->rank_hosts by global rank and each worker's job and rank. */
void job_take_workers(coord *co, coord_job *j);
/* The global rank of the k-th worker taken for a job of spec s. */
int placement_rank_at(const zb_job_spec *s, int k);
/* A cuda job: it runs only on workers that reported a GPU. */
bool job_needs_gpu(const zb_job_spec *spec);
/* The attached workers with a GPU able to run spec: their number, and
 * their ids (the first 8, ", ..." after) into ids. */
int workers_with_gpu(coord *co, const zb_job_spec *spec, char *ids, size_t cap);
int workers_idle(coord *co, const zb_job_spec *spec);
/* Of the attached workers that offer spec's backend (*offer), how many
 * have need bytes of the memory its kind of job uses (*fit; one that
 * advertised none is not judged and fits), and the most one has. */
void workers_memory_fit(coord *co, const zb_job_spec *spec, double need, int *offer, int *fit,
                        long long *most);
int workers_attached(coord *co);
int workers_able(coord *co, const zb_job_spec *spec);
void on_list_workers(zb_rpc_call *call, const ProtobufCMessage *m, void *user);
void on_attach(zb_rpc_call *call, const ProtobufCMessage *m, void *user);

/* reports.c */
void on_report(zb_rpc_call *call, const ProtobufCMessage *m, void *user);

/* learn.c */
/* A rank whose compute over the plan's is this many times the median
 * rank's is a straggler. */
#define COORD_STRAGGLER_RATIO 1.2
/* One aligned iteration of plan pl (its timelines ranks, by global rank,
 * world of them: replica 0's s->p first, summarised in s; a replica whose
 * timeline is missing has n 0): folds its op times into j->learned (T_F,
 * T_B, T_W and T_comm from replica 0, which stands for all; each stage's
 * T_reduce from every replica's spans), re-simulates pl under them into
 * it's predicted figures, sets each rank's slowdown (ris, by rank) and
 * it->straggler_ranks (an array in *stragglers, which the caller frees
 * once the event is out). */
void job_learn(coord_job *j, const zb_planner_result *pl, const zb_tl_rank *ranks, int world,
               const zb_tl_summary *s, Zb__V1__RankIteration *ris, Zb__V1__IterationMetrics *it,
               int32_t **stragglers);
/* j's learned costs as a message (protobuf_c_message_free_unpacked frees
 * it), or NULL before any. */
Zb__V1__LearnedCosts *job_learned_pb(const coord_job *j);
/* Adaptive re-planning after a sampled iteration (docs/wire.md, Timelines):
 * when the job re-plans adaptively and no update is pending, plans its
 * shape under the learned costs (zb-auto for one stage per rank; zb-v,
 * v-half and v-min for V placement, the best that fits the memory limit)
 * and switches to it from the earliest iteration no rank started when it
 * beats the running plan's makespan, under the same costs, by more than
 * adaptive.min_gain; records an event saying so. */
void job_adapt(coord *co, coord_job *j);

/* metrics.c */
zb_err coord_metrics_start(coord *co, zb_diag *diag);
void coord_metrics_stop(coord *co);
/* Re-renders the Prometheus text from the state (loop thread). */
/* The loop is going away: scrapes get the last text from now on. */
void coord_metrics_detach_loop(coord *co);
void coord_metrics_worker_lost(coord *co);
void coord_metrics_job_finished(coord *co, int state);
void coord_metrics_observe_plan(coord *co, double seconds);
void coord_metrics_observe_ops(coord *co, coord_job *job, const Zb__V1__RankIteration *it);
void coord_metrics_count_report(coord *co);
/* Drops a job's op histograms (its series left /metrics, or it is pruned). */
void coord_metrics_forget_job(coord_job *job);
/* metrics_deadline.c: cuts /metrics requests past their deadline (each tick). */
void coord_metrics_sweep(coord *co);

/* dispatch.c: the run-time state of a job about to run. */
void job_runtime_init(coord_job *j);
/* Who runs each rank (every rank has a worker), into the job's row, so
 * written by the same statement as its next state: after a coordinator
 * restart a rank goes back only to its own worker (recovery.c). */
void job_record_owners(coord_job *j);
/* Writes cmd on w's Attach stream (none: dropped). */
void worker_send(coord_worker *w, const Zb__V1__Command *cmd);

/* recovery.c: jobs outlive a coordinator restart. */
void job_recover(coord *co, coord_job *j);
/* A job PENDING when the coordinator stopped waits for workers as
 * before: like every waiting job it holds no plan, and its plan is made
 * from its stored spec when its workers are there (or it fails then,
 * naming why it cannot be planned). */
void job_readmit(coord *co, coord_job *j);
/* An attaching worker (owner: authz_worker_owner) that names a rank of a
 * job waiting for its ranks: false, after failing call with
 * PERMISSION_DENIED, when another identity ran that rank; the rank waits
 * on for its own worker. */
bool coord_attach_allowed(coord *co, zb_rpc_call *call, const char *owner, const char *job_id, int rank);
/* An attaching worker that names a running job: takes its rank back, or
 * releases it from a job this coordinator will not run. */
void coord_attach_running(coord *co, coord_worker *w, const char *job_id, int rank);
/* Fails taken-back jobs whose ranks did not come back in time. */
void coord_recovery_tick(coord *co, int64_t now_ms);

/* retention.c: prunes finished jobs past their age or count (once a second). */
void coord_prune_jobs(coord *co, int64_t now_ms);

/* process.c */
void coord_raise_fd_limit(void);
void coord_metrics_process(zb_buf *b);

#endif
