/* zb_jobspec.h — the job spec, the service's central type: what a user
 * submits (YAML through zb_jobspec_yaml.h, or the wire through zb_wire.h)
 * and what the coordinator plans and the workers run. Plain C structs with
 * their defaults, the fields a cpu job derives, and the checks every
 * reader runs. No YAML, no I/O.
 *
 * Ownership: zb_job_spec owns stage_costs; zb_job_spec_free() releases it
 * (and accepts a zeroed spec).
 */
#ifndef ZB_JOBSPEC_H
#define ZB_JOBSPEC_H

#include <stdbool.h>
#include <stddef.h>

#include "zb_err.h"
#include "zb_names.h" /* the backend names a spec may give */
#include "zb_schedule.h"

/* A job as a user writes it (README "Job spec"):
 *   name: demo                  # required, 1..63 chars [A-Za-z0-9._-]
 *   ranks: 4                    # required, >= 1
 *   microbatches: 16            # required, >= 1
 *   schedule: zb-v              # required, a family name (zb_family_parse)
 *   chunks: 2                   # optional, 0 = the family's default
 *   mem_limit: 2p               # optional: 'Np' (N*ranks M_F units) or a number of M_F units
 *   costs:                      # optional, one rank's whole share, seconds
 *     f: 0.01                   #   T_F (default 0.01)
 *     b: 0.01                   #   T_B (default 0.01)
 *     w: 0.01                   #   T_W (default 0.01)
 *     comm: 0                   #   T_comm per hop (default 0)
 *     mem: [1, -0.5, -0.5]      #   M_F, M_B, M_W (default 1, -0.5, -0.5)
 *     reduce: 0                 #   T_reduce: the rank's whole share of averaging its gradients
 *                               #     across the replicas, once per iteration (default 0; a model
 *                               #     job with data_parallel > 1 derives it, see link_gbps)
 *   stage_costs:                # optional, per stage [T_F, T_B, T_W] seconds (already per chunk)
 *     - [0.01, 0.012, 0.008]
 *   iterations: 10              # optional, default 10
 *   data_parallel: 1            # optional: d replicas of the pipeline, d x ranks workers (default 1;
 *                               #   1..ZB_DATA_PARALLEL_MAX with d x ranks <= the ranks limit, 1024);
 *                               #   global rank g = replica x ranks + pipeline rank (zb_jobspec_dp.h)
 *   zero: 0                     # optional: 1 shards the optimizer state over a stage's replicas
 *                               #   (ZeRO-1); needs data_parallel > 1 and backend cpu or cuda
 *   rank_order: pipelines       # optional: how global ranks land on hosts: pipelines (default: a
 *                               #   replica's stages together, the per-microbatch hops stay on a
 *                               #   host) or stages (a stage's replicas together)
 *   link_gbps: 100              # optional: the reduction's link bandwidth, Gbit/s (default 100, > 0)
 *   link_latency_us: 10         # optional: its per-hop latency, us (default 10, >= 0); a model job
 *                               #   with d > 1 derives each stage's T_reduce from the two as a ring
 *                               #   all-reduce of the stage's fp32 gradients (zb_jobspec_dp.h)
 *   backend: sim                # optional: sim (default), cpu, cuda, torch (a torchrun job)
 *   transport: tcp              # optional: tcp (default), nccl (backend cuda only), torch (backend
 *                               #   torch only, and required there: the run's process group)
 *   torch_run: run-1            # backend torch only, required: the run id its agents attach with,
 *                               #   1..63 chars [A-Za-z0-9._-] (zb_jobspec_torch.c)
 *   precision: fp32             # optional: fp32 (default); tf32, bf16 (backend cuda only)
 *   bytes_per_activation: 65536 # optional, default 65536, 0..1 GiB (cpu, cuda: derived, see below)
 *   wait_for_workers_s: 600     # optional: wait PENDING this long for enough workers to attach
 *                               #   (default 600; 0: refused at once when too few; 0..604800)
 *   transfer_timeout_s: 300     # optional: an nccl job's transfer group may take this long
 *                               #   (default 300; 1..86400)
 *   trace_every: 10             # optional: per-op timelines of iterations 0, N, 2N, ... (default 10;
 *                               #   0: none; 1..1000000)
 *   adaptive:                   # optional: re-plan from the costs the timelines show (docs/wire.md)
 *     enabled: true             #   default: true for zb-auto jobs, false for the others
 *     min_gain: 0.02            #   re-plan when the predicted makespan improves by more than this share
 *     check_every: 1            #   look every N sampled iterations (1..1000000)
 *   model:                      # optional, backends cpu and cuda only: the model it trains (zb_model_spec)
 *     hidden: 64                #   width h (default 64, 1..65536), a multiple of heads
 *     heads: 4                  #   attention heads (default 4)
 *     layers: 8                 #   blocks over all stages (default ranks x chunks, 1..100000)
 *     seq_len: 64               #   tokens per sequence (default 64, 1..1048576)
 *     batch: 4                  #   sequences per microbatch (default 4, 1..1048576)
 *     seed: 1                   #   parameters and data sampling (default 1, >= 1)
 *     data: /path/to/text       #   text file every worker reads (default ZB_MODEL_DEFAULT_DATA)
 *     lr: 3e-3                  #   AdamW learning rate (default 3e-3)
 *     weight_decay: 0.01        #   decoupled, on weight matrices (default 0.01)
 *     beta1: 0.9                #   (default 0.9), in [0, 1)
 *     beta2: 0.95               #   (default 0.95), in [0, 1)
 *     eps: 1e-8                 #   (default 1e-8), > 0
 *     clip_norm: 1.0            #   global gradient-norm clipping (default 1.0; 0: none), >= 0
 *     step: post-validated      #   post-validated (default) or synchronous (zb_step.h)
 *     inject_nan:               #   testing aid, optional: the last stage's loss gradient of
 *       iteration: 3            #     this microbatch of this iteration (0-based) becomes NaN,
 *       microbatch: 0           #     so that step is skipped (both default 0)
 *     checkpoint_every: 0       #   save weights + AdamW state every N iterations and on cancel
 *                               #     (default 0: off; 0..1000000)
 *     checkpoint_dir: /abs/path #   where (required, absolute, when checkpoint_every > 0): files
 *                               #     DIR/JOB_ID/rank<r>-stage<s>.ckpt (train/zb_checkpoint.h)
 *     dump_dir: /abs/path       #   testing aid, optional: each rank writes its stages' weights and
 *                               #     gradients of dumped iterations to DIR/JOB_ID/it<i>-stage<s>.dump
 *                               #     (train/zb_dump.h; zb-gradcheck checks them)
 *     dump_every: 1             #   dump iterations 0, N, 2N, ... and the last (default 1 with dump_dir)
 *     architecture: llama       #   builtin (default), gpt2 or llama (docs/model.md, Jobs with an
 * architecture) config: /path/config.json #   gpt2, llama: a Hugging Face config.json (required), read by the
 *                               #     submitter and sent as its text (config_json); it gives hidden,
 *                               #     heads, layers and the vocabulary, so those keys are left out
 *     weights: /path/dir        #   gpt2, llama, optional: a HF safetensors checkpoint directory on the
 *                               #     workers (default: seeded initialisation)
 *     order: random             #   gpt2, llama: random (default: windows drawn by seed) or
 *                               #     sequential (windows in the shards' order, train/zb_tokens.h)
 * With an architecture, data whose file name ends in ".bin" is a glob of llm.c
 * token shards (train/zb_tokens.h); any other is one text file whose bytes
 * are the tokens (0..255: the config's vocab_size must be at least 256).
 * A job that trains the model (backend cpu or cuda: zb_job_spec_trains_model)
 * has bytes_per_activation one activation of its model, batch * seq_len *
 * hidden * 4 bytes, or * 2 under precision bf16 (the ranks send bf16
 * activations then; docs/model.md, Mixed precision): left out it is
 * derived, given it must be exactly that. The plan's memory figures in
 * bytes count one bytes_per_activation per M_F unit, so they halve too.
 */
/* The text a cpu job trains on when its spec names none: present on every
 * Debian machine (base-files). */
#define ZB_MODEL_DEFAULT_DATA "/usr/share/common-licenses/GPL-3"

/* The longest config.json text a job carries (Hugging Face configs are
 * about 1 KiB). */
#define ZB_MODEL_CONFIG_MAX 16384

/* The built-in model of a cpu or cuda job and its AdamW settings (zb_model.h and
 * zb_optimizer.h on the worker take these values). */
typedef struct zb_model_spec {
  int hidden, heads;
  int layers; /* >= 1; 0 until zb_job_spec_derive() resolves the default */
  int seq_len, batch;
  long long seed; /* >= 1 */
  char data[512]; /* path on the workers */
  double lr, weight_decay, beta1, beta2, eps;
  double clip_norm; /* >= 0; 0: no clipping */
  char step[24];    /* ZB_STEP_POST_VALIDATED_NAME or ZB_STEP_SYNCHRONOUS_NAME */
  bool inject_nan;  /* the test hook is on: */
  int nan_iteration, nan_microbatch;
  int checkpoint_every;                  /* 0: off; N: save after iterations N-1, 2N-1, ... and on cancel */
  char checkpoint_dir[512];              /* absolute; required when checkpoint_every > 0 */
  char resume_from[64];                  /* set by the coordinator only: the job whose checkpoints to load */
  char dump_dir[512];                    /* "" (off) or absolute: gradient dumps (train/zb_dump.h) */
  int dump_every;                        /* 0 means 1 when dump_dir is set; requires dump_dir when > 0 */
  char architecture[16];                 /* zb_arch_kind_name: "builtin" (default), "gpt2", "llama" */
  char config_json[ZB_MODEL_CONFIG_MAX]; /* gpt2, llama: the config.json's text; "" for builtin */
  char weights[512];                     /* "" (seeded init) or a HF checkpoint directory on the workers */
  char order[16]; /* ZB_DATA_ORDER_RANDOM_NAME (default) or ZB_DATA_ORDER_SEQUENTIAL_NAME */
} zb_model_spec;

/* How an architecture job reads its token shards (train/zb_tokens.h):
 * windows drawn by seed, or in the data's own order. */
#define ZB_DATA_ORDER_RANDOM_NAME "random"
#define ZB_DATA_ORDER_SEQUENTIAL_NAME "sequential"

/* Adaptive re-planning (docs/wire.md, Timelines). */
typedef struct zb_adaptive_spec {
  int enabled;     /* 1 on, 0 off; -1 (default): on for zb-auto jobs */
  double min_gain; /* share of the predicted makespan a new plan must save, in [0, 1) (default 0.02) */
  int check_every; /* sampled iterations between looks (default 1) */
} zb_adaptive_spec;

#define ZB_STEP_POST_VALIDATED_NAME "post-validated"
#define ZB_STEP_SYNCHRONOUS_NAME "synchronous"

typedef struct zb_job_spec {
  char name[64];
  char owner[64]; /* the submitter, set by the coordinator (docs/operations.md, Security) */
  int ranks, microbatches;
  char schedule[32];
  int chunks;
  double mem_limit;    /* M_F units, already multiplied out for 'Np'; 0: default */
  zb_rank_costs costs; /* times in seconds; memory deltas in M_F units */
  int n_stage_costs;   /* 0, or the number of [f, b, w] rows given */
  double (*stage_costs)[3];
  int iterations;
  char backend[16], transport[16];
  char precision[8]; /* ZB_PRECISION_FP32_NAME (default), "tf32", "bf16" */
  long long bytes_per_activation;
  int trace_every; /* timelines of iterations 0, N, 2N, ... (default 10); 0: none */
  /* seconds PENDING for enough able workers to attach (default 600); 0:
   * refused at submission when too few are attached */
  int wait_for_workers_s;
  /* seconds an nccl job's transfer group may take before the rank fails
   * naming its peers (default ZB_TRANSFER_TIMEOUT_DEFAULT_S, 1..86400;
   * docs/model.md, Transports) */
  int transfer_timeout_s;
  zb_adaptive_spec adaptive;
  /* data parallelism (zb_jobspec_dp.h): d replicas of the p-rank plan */
  int data_parallel;   /* d >= 1 (default 1) */
  int zero;            /* 0 (default) or 1: ZeRO-1 optimizer sharding */
  char rank_order[16]; /* ZB_RANK_ORDER_PIPELINES (default) or ZB_RANK_ORDER_STAGES */
  double link_gbps;    /* the reduction's bandwidth, Gbit/s (default 100) */
  double link_latency_us;
  /* backend torch only (required there): the torchrun run whose
   * processes run it; zb rank r goes to the agent attached as (torch_run,
   * r) (docs/pytorch.md, Attaching a torchrun job) */
  char torch_run[64];
  bool has_model;      /* a model was given (only a cpu or cuda job may have one) */
  zb_model_spec model; /* defaults unless given; used by cpu and cuda jobs */
} zb_job_spec;

#define ZB_PRECISION_FP32_NAME "fp32"
#define ZB_RANK_ORDER_PIPELINES "pipelines"
#define ZB_RANK_ORDER_STAGES "stages"
#define ZB_TRANSFER_TIMEOUT_DEFAULT_S 300

/* Whether the job trains the built-in model: backend cpu or cuda. Such a
 * job has a resolved model, derives bytes_per_activation from it and
 * keeps its weights on its ranks (resume, schedule updates). */
bool zb_job_spec_trains_model(const zb_job_spec *s);

/* Whether the job re-plans adaptively: adaptive.enabled, or by default a
 * zb-auto job. */
bool zb_job_spec_adaptive(const zb_job_spec *s);

/* Fills the defaults (name empty; ranks, microbatches 0). */
void zb_job_spec_default(zb_job_spec *s);
/* Checks a spec however it was filled (YAML or the wire): required fields,
 * ranges, a known schedule that accepts the shape (zb_plan_check_shape),
 * costs that zb_costs_check accepts, stage_costs count = ranks * chunks.
 * The message names the field as the YAML and proto do ("ranks", "costs.f"). */
zb_err zb_job_spec_check(const zb_job_spec *s, zb_diag *diag);
/* The model's size checks of zb_job_spec_check alone (each size in its
 * range, heads dividing hidden, the products inside an int, one
 * activation within bytes_per_activation's limit), for a model that came
 * some other way (a worker decoding its Assignment); the message starts
 * with prefix ("assignment.") and names the field ("model.hidden"). */
zb_err zb_model_spec_check_sizes(const zb_model_spec *m, const char *prefix, zb_diag *diag);
/* Fills what a cpu or cuda job derives from its other fields (nothing for other
 * backends): model.layers 0 becomes ranks x chunks (the family's default
 * chunks when 0), and bytes_per_activation becomes
 * zb_job_spec_bytes_per_activation() unless bytes_given (then the
 * checker insists they agree). A field it cannot derive yet (an unknown
 * schedule, a bad shape) is left for zb_job_spec_check to refuse. The
 * readers (zb_jobspec_yaml.h) call it; code that fills a spec by hand
 * calls it before the check. */
void zb_job_spec_derive(zb_job_spec *s, bool bytes_given);
/* Bytes of one activation or gradient of the model, batch * seq_len *
 * hidden * 4 (fp32); 0 when a factor is outside its range (see above). */
long long zb_model_spec_bytes_per_activation(const zb_model_spec *m);
/* The job's: the model's at its precision (half under bf16). */
long long zb_job_spec_bytes_per_activation(const zb_job_spec *s);
/* Parameters of the whole model (the byte vocabulary of 256, learned
 * positions, layers of 12 h^2 + 13 h, the final LayerNorm and the head;
 * model/model_stage.c lays them out and test_jobspec checks the two agree). */
double zb_model_spec_params(const zb_model_spec *m);
/* A lower bound of the bytes the busiest rank of a job that trains the
 * model holds before any activation: fp32 parameters, gradients and the
 * two AdamW moments (16 bytes each) of its share of the model, the whole
 * divided by the ranks. The coordinator refuses workers advertising less. */
double zb_job_spec_rank_state_bytes(const zb_job_spec *s);
void zb_job_spec_free(zb_job_spec *s);
/* A torch run id (JobSpec.torch_run, AttachRequest.torch_run): 1..63
 * characters of [A-Za-z0-9._-] within cap bytes. */
bool zb_torch_run_valid(const char *run, size_t cap);
/* The largest torch rank an agent may bind to (AttachRequest.torch_rank)
 * and name in a shared certificate's worker id NAME/RANK (daemon/authz.c):
 * one limit, so an id the certificate check accepts is one the binding
 * check accepts too. */
enum { ZB_TORCH_RANK_MAX = 1023 };

/* The architecture of a model spec (zb_jobspec_arch.c): builtin for
 * architecture "builtin" (its sizes from the spec), else parsed from
 * config_json by zb_arch_from_hf_text. The message names model.config or
 * model.architecture. */
struct zb_arch;
zb_err zb_model_spec_arch(const zb_model_spec *m, struct zb_arch *out, zb_diag *diag);
/* Whether the spec names an architecture other than builtin. */
bool zb_model_spec_has_arch(const zb_model_spec *m);
/* How a job with an architecture reads model.data: llm.c token shards
 * when its last component ends in ".bin" (llm.c's own name for them; a
 * glob or one file), else one text file read as byte tokens. Pure. */
bool zb_model_data_is_shards(const char *data);

#endif
