/* zb_jobspec_fields.h — the job spec's field vocabulary, shared by its
 * checker (zb_jobspec.c) and its readers (zb_jobspec_yaml.c): the keys as
 * YAML and the proto name them, the integer fields' limits, and the
 * checker's verdict as data, so that a reader can blame the line of the
 * key at fault. Constant tables only; nothing here is owned.
 */
#ifndef ZB_JOBSPEC_FIELDS_H
#define ZB_JOBSPEC_FIELDS_H

#include "zb_jobspec.h"

/* Top-level keys, in the order of zb_job_keys. */
typedef enum zb_job_key {
  ZB_JK_NAME,
  ZB_JK_RANKS,
  ZB_JK_MICROBATCHES,
  ZB_JK_SCHEDULE,
  ZB_JK_CHUNKS,
  ZB_JK_MEM_LIMIT,
  ZB_JK_COSTS,
  ZB_JK_STAGE_COSTS,
  ZB_JK_ITERATIONS,
  ZB_JK_BACKEND,
  ZB_JK_TRANSPORT,
  ZB_JK_BYTES,
  ZB_JK_MODEL,
  ZB_JK_PRECISION,
  ZB_JK_TRACE_EVERY,
  ZB_JK_ADAPTIVE,
  ZB_JK_WAIT_WORKERS,
  ZB_JK_TRANSFER_TIMEOUT,
  ZB_JK_DATA_PARALLEL,
  ZB_JK_ZERO,
  ZB_JK_RANK_ORDER,
  ZB_JK_LINK_GBPS,
  ZB_JK_LINK_LATENCY,
  ZB_JK_TORCH_RUN,
  ZB_JK_COUNT
} zb_job_key;

/* Keys under costs: times in seconds, then the memory deltas triple. */
typedef enum zb_cost_key {
  ZB_CK_F,
  ZB_CK_B,
  ZB_CK_W,
  ZB_CK_COMM,
  ZB_CK_MEM,
  ZB_CK_REDUCE,
  ZB_CK_COUNT
} zb_cost_key;

/* Keys under model. The integer sizes come first (through ZB_MK_BATCH). */
typedef enum zb_model_key {
  ZB_MK_HIDDEN,
  ZB_MK_HEADS,
  ZB_MK_LAYERS,
  ZB_MK_SEQ_LEN,
  ZB_MK_BATCH,
  ZB_MK_SEED,
  ZB_MK_DATA,
  ZB_MK_LR,
  ZB_MK_WEIGHT_DECAY,
  ZB_MK_BETA1,
  ZB_MK_BETA2,
  ZB_MK_EPS,
  ZB_MK_CLIP_NORM,
  ZB_MK_STEP,
  ZB_MK_INJECT_NAN,
  ZB_MK_CHECKPOINT_EVERY,
  ZB_MK_CHECKPOINT_DIR,
  ZB_MK_DUMP_DIR,
  ZB_MK_DUMP_EVERY,
  ZB_MK_ARCHITECTURE,
  ZB_MK_CONFIG,
  ZB_MK_WEIGHTS,
  ZB_MK_ORDER,
  ZB_MK_COUNT
} zb_model_key;

/* Keys under adaptive. */
typedef enum zb_adaptive_key {
  ZB_AK_ENABLED,
  ZB_AK_MIN_GAIN,
  ZB_AK_CHECK_EVERY,
  ZB_AK_COUNT
} zb_adaptive_key;
extern const char *const zb_adaptive_keys[ZB_AK_COUNT];
extern const char *const zb_adaptive_fields[ZB_AK_COUNT];

/* Keys under model.inject_nan. */
typedef enum zb_nan_key { ZB_NK_ITERATION, ZB_NK_MICROBATCH, ZB_NK_COUNT } zb_nan_key;

/* Key names as written in a mapping ("f"), and fields as messages name
 * them ("costs.f"). */
extern const char *const zb_job_keys[ZB_JK_COUNT];
extern const char *const zb_cost_keys[ZB_CK_COUNT];
extern const char *const zb_cost_fields[ZB_CK_COUNT];
extern const char *const zb_model_keys[ZB_MK_COUNT];
extern const char *const zb_model_fields[ZB_MK_COUNT];
extern const char *const zb_nan_keys[ZB_NK_COUNT];
extern const char *const zb_nan_fields[ZB_NK_COUNT];

/* An integer field's range. Below min is also below what the type allows
 * (a negative size, a count of 0), so a reader may call it a wrong type. */
typedef struct zb_int_limit {
  long long min, max;
} zb_int_limit;

/* Indexed by key; set for the integer keys only: ranks, microbatches,
 * chunks, iterations, bytes_per_activation, trace_every; the model's sizes, seed,
 * checkpoint_every and dump_every. */
extern const zb_int_limit zb_job_limits[ZB_JK_COUNT];
extern const zb_int_limit zb_model_limits[ZB_MK_COUNT];
/* model.inject_nan's indices, before the checker holds them to the shape. */
extern const zb_int_limit zb_nan_index_limit;

/* Why a spec was refused: the field as YAML and the proto name it, which
 * key to blame and which part of it (a zb_cost_key under costs, a
 * zb_model_key under model, a row of stage_costs; else -1), and the reason
 * without the field's name. */
typedef struct zb_job_fault {
  zb_job_key key;
  int sub;
  char field[32];
  char reason[256];
} zb_job_fault;

/* The data-parallel keys' checks (zb_jobspec_dp.c): data_parallel within
 * the ranks limit, zero only where it means something, rank_order, the
 * link figures. Sets the fault and returns ZB_ERR_INVALID_ARG, or ZB_OK. */
zb_err zb_job_spec_check_dp(const zb_job_spec *s, zb_job_fault *f);

/* The torch backend's checks (zb_jobspec_torch.c): torch_run and
 * transport torch with backend torch only, and there one pipeline, no
 * model, no ZeRO. Sets the fault and returns ZB_ERR_INVALID_ARG, or ZB_OK. */
zb_err zb_job_spec_check_torch(const zb_job_spec *s, zb_job_fault *f);

/* zb_job_spec_check, with the fault as data for a reader to place. */
zb_err zb_job_spec_find_fault(const zb_job_spec *s, zb_job_fault *f);

/* The checks of a job with an architecture (zb_jobspec_arch.c): its
 * config parses, matches the architecture and gives the sizes, and its
 * data and sequence length fit it. Sets the
 * fault (f) and returns ZB_ERR_INVALID_ARG, or ZB_OK. */
zb_err zb_job_spec_check_arch(const zb_job_spec *s, zb_job_fault *f);
/* Sets *f (as zb_jobspec.c's checks do); returns ZB_ERR_INVALID_ARG. */
zb_err zb_job_fault_set(zb_job_fault *f, zb_job_key key, int sub, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
