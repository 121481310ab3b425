/* cpu_job.h — what a cpu job keeps on this rank from its first iteration
 * to its last, across plan updates (docs/model.md, Optimizer and step):
 * the cpu backend (its stages hold the weights and gradients), one AdamW
 * per hosted stage, the global step with its check (on the device for a
 * cuda job, zb_step_device.h), the text it samples,
 * gradient dumps, and checkpoints with resume (cpu_job_ckpt.c).
 *
 * Ownership: a cpu_job is the job thread's; cpu_job_close frees what it
 * holds (also a zeroed or half-opened one). Built only with the cpu
 * backend (ZB_WITH_CPU_BACKEND).
 */
#ifndef ZB_CPU_JOB_H
#define ZB_CPU_JOB_H

#include <stdatomic.h>

#include "zb_arch.h"
#include "zb_assignment.h"
#include "zb_backend_cpu.h"
#include "zb_collective.h"
#include "zb_optimizer.h"
#include "zb_roots.h"
#include "zb_step.h"
#include "zb_step_chain.h"
#include "zb_step_device.h"
#include "zb_tokens.h"
#include "zb_transport.h"

/* What a cpu job keeps on this rank from its first iteration to its last,
 * across plan updates: the backend (its stages hold the weights and
 * gradients), one AdamW per hosted stage, and the text it samples. */
typedef struct cpu_job {
  /* Set by the caller before cpu_job_open: the device of a cuda job
   * (borrowed; NULL: the host, a cpu job) and whether its transport moves
   * host memory (tcp), so messages are staged through the host. */
  zb_device *device;
  bool host_transport;
  /* and the worker's --path-root set (borrowed): the text, checkpoints and
   * dumps are opened beneath it (zb_roots.h); off: the paths as named */
  const zb_roots *roots;
  zb_backend *be;
  zb_adamw **opt; /* per hosted stage, in the backend's (ascending) order */
  zb_stepper *stepper;
  /* a cuda job's step on the device (moments there too); NULL: the host
   * step over params (a cpu job). With it the host views below and opt's
   * moments are filled only when needed: dumps, checkpoints. */
  zb_step_device *dstep;
  float **params, **grads; /* per hosted stage, into the backend's stages */
  int rank, nranks;        /* the pipeline rank and the plan's p */
  int peer_base; /* transport rank of its replica's pipeline rank 0 (docs/formats.md, Data parallelism) */
  /* data parallelism (docs/model.md, Data parallelism): this rank's
   * replica of data_parallel; reduced[i]: hosted stage i's gradients were
   * all-reduced this iteration (cpu_job_reduce.c); unscaled[i]: a cuda
   * job's all-reduce of stage i is started, its join and 1/d scale not
   * yet submitted (cpu_job_reduce_device.c) */
  int replica, data_parallel;
  bool *reduced, *unscaled;
  /* ZeRO-1 (cpu_job_zero.c): zero is 1 when the job asks for it and
   * d > 1. Hosted stage i's optimizer covers shard_len[i] parameters
   * from shard_off[i] (zb_ring_shard of its n over d, member replica;
   * without ZeRO-1 all of them from 0); pview[i] and gview[i] point there
   * into params[i] and grads[i]. */
  int zero;
  size_t *shard_off, *shard_len;
  float **pview, **gview;
  zb_transport *tr; /* borrowed: the job's transport, set by the job runner for the reduce hook */
  /* borrowed: a cuda job's stage group communicator (d > 1), set by the
   * job runner; the reduction's path then (cpu_job_reduce_device.c) */
  struct zb_group_comm *group_comm;
  int *stages, n_stages, total_stages, microbatches;
  zb_placement placement; /* of the plan that placed the stages: p ranks, v stages each */
  int p, v;
  bool last; /* hosts the last stage: computes and reports the loss */
  uint8_t *text;
  size_t text_len;
  zb_cpu_text *source; /* points into text; on the heap: the backend keeps its address */
  /* a job with an architecture (gpt2, llama; cpu_job_arch.c): the arch its
   * config gives, and its token shards when this rank hosts an end stage;
   * fill: what the data callback reads, on the heap, since the backend
   * keeps its address while a plan update moves this struct */
  bool has_arch;
  zb_arch arch;
  zb_tokens *tokens;
  struct cpu_arch_fill *fill;
  /* checkpoints (zb_checkpoint.h): on when ckpt_every > 0 */
  char job_id[64];
  int ckpt_every;
  char ckpt_dir[512];
  char resume_from[64]; /* "" or the job whose checkpoints to load before the first iteration */
  int completed;        /* the last iteration whose step is done here; -1: none */
  int saved;            /* the iteration of the last checkpoint written; -1: none */
  int hf_kept[2];       /* an architecture job's Hugging Face saves on disk, newest first; -1: none */
  bool torn;            /* an iteration failed after its step: the state is no iteration's */
  const atomic_bool *stop;
  /* gradient dumps (zb_dump.h): on when dump_dir[0] */
  char dump_dir[700]; /* DIR/JOB_ID */
  int dump_every, iterations;
  float **before;      /* per hosted stage: the parameters before this iteration's step */
  zb_model_spec model; /* what the dumps record of the model */
} cpu_job;

/* Creates the state from the job's first assignment. */
zb_err cpu_job_open(cpu_job *cj, const zb_assignment *a, const atomic_bool *stop, zb_diag *diag);
/* Whether this rank hosts the same stages under sched as now. */
bool cpu_job_same_stages(const cpu_job *cj, const zb_schedule *sched, int rank);
/* After an iteration's W ops: the step on every hosted stage, checked
 * globally (the reduction runs along the ranks over tr), then the loss
 * when this rank has the last stage; dumps when the iteration is one. */
zb_err cpu_job_step(cpu_job *cj, zb_transport *tr, int iteration, bool *has_loss, double *loss,
                    zb_step_result *step, zb_diag *diag);
void cpu_job_close(cpu_job *cj);

/* cpu_job_arch.c: a job with an architecture. cpu_job_arch_open parses
 * the model's config into cj->arch (has_arch) and, when the rank hosts
 * the first or the last stage, opens its token shards; *data is then the
 * backend's data source. cpu_job_arch_weights reads each hosted stage's
 * tensors from model.weights (when given) after the backend made them. */
zb_err cpu_job_arch_open(cpu_job *cj, bool ends, zb_cpu_data *data, zb_diag *diag);
zb_err cpu_job_arch_weights(cpu_job *cj, zb_diag *diag);

/* cpu_job_tied.c: a tied head over several stages (docs/model.md, Tied
 * head). cpu_job_tied says whether the job has one; cpu_job_tie_grads,
 * after an iteration's W ops and before its step, makes each holder's
 * gradient the sum of both (over tr when the other holder is on another
 * rank); cpu_job_tied_count_once makes the step's check count the weight
 * once (call it after every new stepper). */
bool cpu_job_tied(const cpu_job *cj);
zb_err cpu_job_tie_grads(cpu_job *cj, zb_transport *tr, int iteration, zb_diag *diag);
zb_err cpu_job_tied_count_once(cpu_job *cj, zb_diag *diag);

/* cpu_job_reduce.c: the gradient reduction across replicas (docs/model.md,
 * Data parallelism). With data_parallel d > 1 every replica's pipeline
 * rank r holds the same stages; their gradients are all-reduced over the
 * stage group {k * p + r : k < d} with the ring (zb_collective.h), summed
 * in the ring's fixed order, then scaled by 1/d, so each becomes the
 * gradient of the mean loss over the global batch and every replica holds
 * the same bits. A stage's gradients are one contiguous buffer (the
 * model's grads array, its tensors in the stage's order), reduced as one
 * collective of tag stage `stage` and seq 2 * iteration.
 * cpu_job_reduce_stage: REDUCE_GRAD(stage) (the executor's reduce hook,
 * ud: the cpu_job); fails for a stage this rank does not host or one
 * reduced twice in an iteration. For a cuda job it only starts the
 * all-reduce (cpu_job_reduce_device_start); cpu_job_reduce_wait (the
 * executor's reduce_wait hook, ud: the cpu_job) completes every started
 * one (a no-op for a cpu job, whose ring is done when the hook returns).
 * cpu_job_reduce_rest: before the step, the hosted stages no action
 * reduced this iteration, ascending (a list without REDUCE_GRAD still
 * never steps unreduced gradients), then completes every started one,
 * then every stage counts as unreduced again. All are no-ops with d = 1. */
zb_err cpu_job_reduce_stage(void *cj, int stage, int iteration, zb_diag *diag);
zb_err cpu_job_reduce_wait(void *cj, int iteration, zb_diag *diag);
zb_err cpu_job_reduce_rest(cpu_job *cj, zb_transport *tr, int iteration, zb_diag *diag);
/* cpu_job_reduce_device.c: a cuda job's reduction (what the three above
 * run when cj->device is set), in two halves. _start(i): hosted stage
 * i's device gradients all-reduced over cj->group_comm on its stream,
 * after the compute stream's work so far (the stage's last W), without
 * holding the compute stream or the host; marks unscaled[i]. _finish:
 * when a stage is unscaled, the compute stream waits for the group's
 * collectives (zb_group_comm_join), each unscaled stage is scaled by 1/d
 * there, then the host waits once for the group (bounded by its timeout
 * and stop flag, the watchdog's deadline: a lost member fails here, not
 * in an unbounded device sync). Fail without a group; ZB_ERR_UNSUPPORTED
 * in a worker built without CUDA. */
zb_err cpu_job_reduce_device_start(cpu_job *cj, int i, zb_diag *diag);
zb_err cpu_job_reduce_device_finish(cpu_job *cj, zb_diag *diag);
/* The executor's reduce_abort (ud: the cpu_job): aborts cj->group_comm
 * when there is one, so the other replicas' members fail now. */
void cpu_job_reduce_abort(void *ud, const char *why);

/* cpu_job_zero.c: ZeRO-1 optimizer sharding (docs/model.md, Data
 * parallelism: ZeRO-1). With zero 1 the reduction is a reduce-scatter
 * (each replica keeps its shard of the summed gradients, scaled by 1/d),
 * the step runs on pview/gview with AdamW moments for the shard only, the
 * check gathers every member's partial within the stage group (summed in
 * member order) before the step chain, and cpu_job_zero_gather
 * all-gathers the stepped shards into every replica's params (and, on a
 * dump iteration, the gradients' shards, so dumps hold the whole reduced
 * gradient). Ring tags: kind REDUCE_GRAD, the stage, seq
 * cpu_job_zero_seq(iteration, which) for a stage's collectives; the
 * check's all-gather uses stage -1, seq iteration. */
enum {
  CPU_JOB_ZERO_SEQ_REDUCE = 0, /* the reduction: an all-reduce takes this and the next */
  CPU_JOB_ZERO_SEQ_PARAMS = 2, /* the stepped parameters' all-gather */
  CPU_JOB_ZERO_SEQ_GRADS = 3,  /* the gradients' all-gather, dump iterations only */
  CPU_JOB_ZERO_SEQS = 4
};
int32_t cpu_job_zero_seq(int iteration, int which);
/* The stage group's ring for tag stage `stage` from seq; ranks: the
 * caller's d ints, filled here (borrowed by the ring). */
zb_ring cpu_job_ring(const cpu_job *cj, zb_transport *tr, int32_t stage, int32_t seq, int *ranks);
/* Whether hosted stage i's reduction leaves its whole gradient: no
 * ZeRO-1, or a tied head's holder (the tie sums whole tensors after it). */
bool cpu_job_zero_full(const cpu_job *cj, int i);
/* After cj->params and cj->grads: the shards and views (allocated). */
void cpu_job_zero_layout(cpu_job *cj);
void cpu_job_zero_free(cpu_job *cj);
/* The optimizer state on this rank: m and v of every hosted stage. */
size_t cpu_job_optimizer_bytes(const cpu_job *cj);
/* The step's zb_step_reduce_fn (arg: a cpu_job_check): with ZeRO-1 the
 * stage group's partials first, then the chain along the pipeline. */
typedef struct cpu_job_check {
  const cpu_job *cj;
  zb_step_chain *chain;
} cpu_job_check;
zb_err cpu_job_zero_check(void *arg, zb_step_partial *p, zb_diag *diag);
/* After the step: every hosted stage's parameters (and with grads its
 * gradients) all-gathered from the replicas' shards; no-op without
 * ZeRO-1. */
zb_err cpu_job_zero_gather(cpu_job *cj, zb_transport *tr, int iteration, bool grads, zb_diag *diag);

/* cpu_job_hf.c: with each checkpoint of an architecture job, the model
 * after iteration `iteration` as a Hugging Face directory,
 * CKPT_DIR/JOB_ID/model-it<iteration>/ (docs/model.md); no-op for the
 * builtin model. The two newest saves are kept. */
zb_err cpu_job_save_hf(cpu_job *cj, int iteration, zb_diag *diag);

/* cpu_job_restage.c */
/* Takes a plan update at an iteration boundary: nothing to do when this
 * rank hosts the same stages; otherwise builds the new partition's stages
 * and optimizers and moves every tensor's weights and AdamW moments from
 * its old home to its new one over tr (every rank of the job calls this
 * for the same update, or the exchange fails naming the silent peer).
 * While it runs both partitions are in memory. The old partition's
 * checkpoints are removed and, with checkpoints on, the new one is saved
 * at once (cj->completed). On failure cj is unchanged. */
zb_err cpu_job_update(cpu_job *cj, const zb_assignment *a, zb_transport *tr, zb_diag *diag);

/* cpu_job_ckpt.c */
/* A cuda job's weights and moments into the host views and optimizers
 * (no-op for a cpu job): what a checkpoint or a restage reads. */
zb_err cpu_job_pull_state(cpu_job *cj, zb_diag *diag);
/* Removes this rank's checkpoint files (and .prev) of its hosted stages. */
void cpu_job_forget_checkpoints(const cpu_job *cj);
/* Saves every hosted stage after iteration `iteration` (the state now). */
zb_err cpu_job_save(cpu_job *cj, int iteration, zb_diag *diag);
/* Loads job cj->resume_from's checkpoint (the last iteration every rank
 * holds, agreed over tr); *k: the iteration loaded. */
zb_err cpu_job_resume(cpu_job *cj, zb_transport *tr, int *k, zb_diag *diag);

#endif
