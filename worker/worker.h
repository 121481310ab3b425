/* worker.h — zb-worker's shared state and its parts (docs/architecture.md,
 * Threads):
 *   main.c          flags, the control loop: the Attach stream, commands,
 *                   heartbeats (the main thread);
 *   job.c           the job runner: one assignment and its updates at a
 *                   time, on the job thread;
 *   report.c        Reports to the coordinator, from either thread;
 *   admit.c         whether the worker can hold an assignment's rank;
 *   cpu_job.c       a cpu job's training state: model, optimizers, step,
 *   cpu_job_ckpt.c  dumps; its checkpoints and resume;
 *   gpu.c           the GPU it offers (--gpu), probed at start;
 *   nccl_id.c       an nccl job's bootstrap id through the coordinator.
 * The two threads share `worker` under its mutex: the next assignment, a
 * pending plan update, the running job's stop flag and its NCCL ids (the
 * job's and its stage group's).
 */
#ifndef ZB_WORKER_H
#define ZB_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "zb/v1/zb.pb-c.h"
#include "zb_assignment.h"
#include "zb_clock.h"
#include "zb_executor.h"
#include "zb_roots.h"
#include "zb_rpc.h"
#include "zb_step.h"
#include "zb_timeline.h"

enum { WORKER_MAX_PATH_ROOTS = ZB_ROOTS_MAX, WORKER_SENT_REPORTS = 8 };

typedef struct worker {
  char id[64];
  char data_address[128];
  int data_fd; /* the listening data port, open for the worker's life */
  char hostname[64];
  long long max_receive_bytes; /* the control channel's receive limit, told to the coordinator */
  /* set once by worker_gpu_probe before the threads start */
  bool has_cuda;   /* offers backend cuda and transport nccl */
  int gpu_ordinal; /* --gpu: the CUDA device cuda jobs run on */
  char gpu[256];   /* AttachRequest.gpu: "" without one */
  char blas[128];  /* AttachRequest.blas: the CBLAS the cpu backend uses (zb_blas.h), "none" without one */
  /* advertised to the coordinator (0: not known): host memory for cpu jobs
   * (memory.c, or --memory-bytes), and the GPU's free memory at start
   * (cudaMemGetInfo, not its total: other processes and the context hold
   * the rest) for cuda jobs */
  long long memory_bytes, gpu_memory_bytes;
  long long
      gpu_workspace_bytes; /* the cuBLAS workspace a cuda job's device takes (zb_cublas_workspace_bytes) */
  zb_rpc_client *rpc;
  atomic_bool shutdown;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* guarded by mu */
  zb_assignment *next_job; /* an assignment waiting for the job thread */
  zb_assignment *update;   /* a plan update for the running job */
  char running_job[64];    /* "" when idle */
  int running_rank;        /* its rank, told to a coordinator it attaches to */
  /* the running job's last reports the coordinator took, packed: sent
   * again to a restarted coordinator, which lost those of iterations it
   * had not completed (docs/operations.md, Coordinator restarts) */
  uint8_t *sent[WORKER_SENT_REPORTS];
  size_t sent_len[WORKER_SENT_REPORTS];
  int n_sent;
  atomic_bool *job_stop; /* the running job's stop flag */
  char nccl_job[64];     /* the job whose NCCL id nccl_id holds; "" none */
  uint8_t nccl_id[ZB_NCCL_ID_BYTES];
  /* and its stage group's (data_parallel > 1): the job, the group's
   * pipeline rank, the id */
  char group_job[64];
  int group_rank;
  uint8_t group_id[ZB_NCCL_ID_BYTES];
  zb_clock_offset clock; /* the coordinator's clock against ours, from report round trips */
  /* set once at start: added to every time the worker reports (its
   * clock), so tests can give one worker a skewed clock
   * (ZB_TEST_CLOCK_SKEW_SECONDS) */
  double clock_skew;
  /* test knobs ZB_TEST_SIM_SLOWDOWN and ZB_TEST_SIM_SLOWDOWN_FROM: sim ops
   * take sim_slowdown times longer from iteration sim_slowdown_from on */
  double sim_slowdown;
  int sim_slowdown_from;
  /* --path-root: the only directories job-spec paths may name (none:
   * any), each held open from start; a job's every file is opened beneath
   * one (zb_roots.h) */
  zb_roots roots;
} worker;

/* paths.c (docs/operations.md, Security) */
/* Adds a --path-root (it must exist; kept open). */
zb_err worker_add_path_root(worker *w, const char *dir, zb_diag *diag);
/* ZB_OK when path ("" passes) lies inside a path root, or none is set;
 * else an error naming what, the path and the roots. */
zb_err worker_check_path(const worker *w, const char *what, const char *path, zb_diag *diag);
/* model.data, model.checkpoint_dir and model.dump_dir of a job. */
zb_err worker_check_model_paths(const worker *w, const zb_model_spec *ms, zb_diag *diag);

/* admit.c (docs/operations.md, Workers) */
/* What an assignment's rank needs here, a lower bound in bytes: model
 * state, and `live` activations (the plan's peak, in units of one; a sim
 * job's two buffers) of bytes_per_activation each. */
typedef struct worker_need {
  double state, activations, live;
} worker_need;
void worker_assignment_need(const zb_assignment *a, worker_need *out);
/* ZB_ERR_INFEASIBLE naming the rank, the worker and both figures when the
 * need is more than the memory the worker advertised (the GPU's for a
 * cuda job); ZB_OK otherwise, and when it advertised none. */
zb_err worker_admit(const worker *w, const zb_assignment *a, zb_diag *diag);

/* The worker's clock in seconds: CLOCK_MONOTONIC plus the test skew. */
static inline double worker_clock(const worker *w) {
  return zb_clock_s() + w->clock_skew;
}

/* Frees a heap-allocated decoded assignment; NULL is a no-op. */
void worker_assignment_free(zb_assignment *a);
void worker_sleep_ms(int ms);

/* report.c */
typedef enum report_result { REPORT_OK, REPORT_STOP, REPORT_FAILED } report_result;
/* Sends one Report. REPORT_STOP: the coordinator asked the rank to stop;
 * REPORT_FAILED: the call failed (the coordinator refused it, or did not
 * answer in time), with the status in why when given. */
report_result worker_report(worker *w, Zb__V1__ReportRequest *req, char *why, size_t why_len);
/* worker_report, retried while the coordinator does not answer
 * (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED: paused, restarting, a lost
 * answer, or a draining coordinator that cancelled the call)
 * for up to WORKER_REPORT_RIDE_OUT_S, with backoff, unless stop is raised:
 * a short pause of the coordinator never fails a rank by itself. The
 * coordinator takes a repeated report as the one it has (reports.c). */
report_result worker_report_retry(worker *w, Zb__V1__ReportRequest *req, const atomic_bool *stop, char *why,
                                  size_t why_len);
enum { WORKER_REPORT_RIDE_OUT_S = 60 };
/* Reports that rank of job_id ended: failed with error, or done (NULL),
 * riding out a coordinator that does not answer as worker_report_retry.
 * from_peer: the error only says a peer closed its connection
 * (zb_transport_failed_by_peer; ReportRequest.error_from_peer). */
void worker_report_end(worker *w, const char *job_id, int rank, const char *error, bool from_peer);
/* After attaching again with a running job: sends its kept reports again
 * (the coordinator counts each once). */
void worker_report_resend(worker *w);
/* Forgets the kept reports (a job starts or ends). */
void worker_report_forget(worker *w);

/* What the job thread keeps while it runs one plan of a job. */
typedef struct job_run {
  worker *w;
  const zb_assignment *a;
  int plan_version;
  char lost[300]; /* why an iteration's report failed; "" if none did */
} job_run;

/* Reports one iteration (loss: the mean training loss when has_loss) and
 * says whether to go on with the current plan: false when the coordinator
 * said stop, the report failed (jr->lost says why), or an update starts
 * at the next iteration. */
bool report_iteration(job_run *jr, const zb_rank_iteration *it, bool has_loss, double loss,
                      const zb_step_result *step);

/* gpu.c */
/* Probes CUDA device `ordinal` (after CUDA_VISIBLE_DEVICES) where the
 * worker is built with CUDA (ZB_WITH_CUDA): on success sets w->has_cuda and
 * w->gpu ("NAME (79.6 GiB, cc 9.0, CUDA driver 13.0)"; the CPU stand-in's
 * says "stand-in"); otherwise logs why once and offers no cuda. Without
 * CUDA it does nothing. Call before the threads start. */
void worker_gpu_probe(worker *w, int ordinal);

/* cuda_job.c: a cuda job's device and an nccl job's transport (the one
 * place job.c depends on ZB_WITH_CUDA). */
struct zb_device;
/* The device of a cuda job (w->gpu_ordinal, a's precision), made before
 * the transport; *out stays NULL for other backends. The caller frees it
 * with zb_device_free after the backend. ZB_ERR_UNSUPPORTED without CUDA. */
zb_err worker_cuda_device(worker *w, const zb_assignment *a, struct zb_device **out, zb_diag *diag);
/* The transport of an nccl job: rank 0 makes the NCCL id, the coordinator
 * hands it to every rank (worker_nccl_exchange), then each rank creates
 * its transport ordered after dev's stream. ZB_ERR_UNSUPPORTED without
 * CUDA. */
zb_err worker_nccl_transport(worker *w, const zb_assignment *a, struct zb_device *dev, atomic_bool *stop,
                             zb_transport **out, zb_diag *diag);
/* The stage group communicator of a cuda job with data_parallel > 1
 * (docs/model.md, Data parallelism; zb_group_comm.h): replica 0 makes the
 * group's id, the coordinator hands it to the members
 * (worker_nccl_group_exchange), then each creates and connects its
 * member on dev's stream, bounded by the job's transfer_timeout_s and
 * *stop. Call after the p2p transport connected (every rank joins the
 * two communicators in the same order). The caller frees *out with
 * zb_group_comm_free after the job. ZB_ERR_UNSUPPORTED without CUDA. */
struct zb_group_comm;
zb_err worker_group_comm(worker *w, const zb_assignment *a, struct zb_device *dev, atomic_bool *stop,
                         struct zb_group_comm **out, zb_diag *diag);
/* Ends a job's stage group: aborts it first when why is given (the job
 * failed or was stopped: the other members, blocked on this one, fail now
 * rather than by their timeout; logged "stage 1's group (...) aborted:
 * why"), then frees it. NULL is a no-op. */
void worker_group_comm_end(struct zb_group_comm *g, const char *why);

/* nccl_id.c */
/* Takes Command.nccl_id on the main thread: keeps the id for the job it
 * names when that job is running or next, and wakes the job thread. */
void worker_take_nccl_id(worker *w, const Zb__V1__NcclId *pb);
/* The job thread's side of the exchange (docs/wire.md, NCCL id exchange):
 * rank 0 reports `mine` (ZB_NCCL_ID_BYTES, made by ncclGetUniqueId; NULL on
 * every other rank), then every rank waits for the coordinator's
 * Command.nccl_id of a's job and copies it to out. Bounded by timeout_s and
 * by *stop (and the worker's shutdown). ZB_ERR_INVALID_ARG when mine is
 * given on a rank other than 0 or missing on rank 0; ZB_ERR_IO when the
 * report fails, the wait times out or the job is stopped, naming which. */
zb_err worker_nccl_exchange(worker *w, const zb_assignment *a, const uint8_t *mine,
                            uint8_t out[ZB_NCCL_ID_BYTES], double timeout_s, atomic_bool *stop,
                            zb_diag *diag);
/* The same for the id of a's stage group (a cuda job with data_parallel
 * > 1; docs/wire.md, NCCL id exchange): replica 0 reports `mine` as
 * ReportRequest.nccl_group_unique_id (NULL on every other replica), then
 * every member waits for Command.nccl_id with stage_group set and
 * pipeline_rank a->rank. Same bounds and errors. */
zb_err worker_nccl_group_exchange(worker *w, const zb_assignment *a, const uint8_t *mine,
                                  uint8_t out[ZB_NCCL_ID_BYTES], double timeout_s, atomic_bool *stop,
                                  zb_diag *diag);

/* job.c */
/* The job thread: runs each assignment w->next_job receives to its end. */
void *job_thread(void *arg);

/* memory.c: available host memory, capped by the cgroup's limit (0: unknown). */
long long worker_host_memory(void);
/* The memory limit of the worker's own cgroup and its ancestors (v2
 * memory.max, v1 memory.limit_in_bytes, the tightest); 0: none. */
long long worker_memory_limit(void);

#endif
