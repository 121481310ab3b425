/* zb_backend_cpu.h — the backends that run the model on a device ("cpu":
 * the host device; "cuda": a CUDA device), behind zb_backend.h's vtable
 * (docs/model.md, Backends). Apart from zb_backend.h so that the executor
 * and the transports, which see only the vtable, include no model header.
 */
#ifndef ZB_BACKEND_CPU_H
#define ZB_BACKEND_CPU_H

#include "zb_backend.h"
/* ---- cpu and cuda: the model's math on a device ---- */

/* "cuda" is the same backend over a CUDA device (zb_device_cuda_new):
 * submit() enqueues the op on the device's stream and returns, sync()
 * waits for the stream, busy times come from device events around each
 * op, and every zb_backend_cpu_* function below applies to it as well.
 * Its slots are device memory (an nccl transport reads and writes them
 * directly) unless host_transport is set. What follows says "cpu" for
 * both. */

/* The cpu backend runs the built-in model (zb_model.h, docs/model.md) on the
 * stages a rank hosts: one zb_model_stage per hosted stage, F/B/W/BW on the
 * calling thread with CBLAS. submit() returns when the op's math is done,
 * so sync() has nothing to wait for.
 *
 * Data flow for (stage s, microbatch mb); a "slot" is one buffer of
 * batch*seq_len*hidden floats per (kind, stage, mb), allocated on first use
 * and reused every iteration:
 *   F   input: the first stage reads tokens from the data source; a stage
 *       whose predecessor s-1 lives on this rank (the turn of a V placement,
 *       or every stage when one rank hosts them all) reads s-1's SEND_F
 *       slot directly (no comm op in the list); any other stage reads its
 *       RECV_F slot, which the transport filled. Output: the last stage
 *       computes the loss (targets from the data source); any other writes
 *       its SEND_F slot.
 *   B   input: the last stage starts from the loss; a stage whose successor
 *       s+1 is local reads s+1's SEND_B slot; any other its RECV_B slot.
 *       Output: dx into the stage's SEND_B slot (none on the first stage).
 *   W   adds mb's parameter gradients to the stage's gradient buffers.
 *   BW  B then W, each timed on its own (so busy B and W are measured, not
 *       split by a cost ratio).
 * Every slot records the iteration it was last written (or handed to the
 * transport) in, and an op whose input was not produced in the current
 * iteration fails (ZB_ERR_INVALID_ARG) instead of computing on stale bytes;
 * a SEND of a slot its F or B has not written this iteration fails too.
 *
 * bytes_per_activation: every SEND/RECV carries one activation or gradient,
 * batch*seq_len*hidden fp32 values, so the executor (and the job that sets
 * its bytes_per_activation) must use exactly
 * zb_backend_cpu_bytes_per_activation(&model) = batch*seq_len*hidden*4;
 * buffer() refuses any other len with ZB_ERR_INVALID_ARG naming both.
 *
 * Iterations: the caller calls zb_backend_cpu_begin_iteration() before each
 * iteration's first op (the worker: before zb_executor_run and from its
 * iteration callback, after it used the gradients). It zeroes the
 * gradients, clears the losses, drops microbatch states an aborted
 * iteration left behind, and names the iteration the data source samples.
 * Gradients then accumulate over the iteration's microbatches; with
 * model.loss_scale = 1/m they are those of the mean loss over the m
 * microbatches.
 *
 * Stats (take_stats): busy seconds measured per kind; mem_bytes and
 * peak_bytes are the bytes all hosted stages' microbatch states hold (the
 * activations the plan's memory model counts), the peak taken over the
 * whole rank (the sum over its stages) and including the transient within
 * an op. Slots, parameters, gradients and workspace are fixed per job and
 * reported by zb_backend_cpu_mem().
 *
 * The stop flag is checked before every op; an op that started runs to its
 * end (ops of the built-in model are short).
 *
 * Borrowed beyond the constructor: the stop flag and the data source (its
 * ud, and for the text source the text) must outlive the backend. Stages,
 * slots and losses are owned by the backend; pointers into them (stages
 * from zb_backend_cpu_stage, tensors and arrays from zb_model) stay valid
 * until it is freed. */

#include "zb_device.h"
#include "zb_model.h"

/* Fills tokens and targets (batch*seq_len bytes each, token ids below the
 * model's vocab) of microbatch mb of iteration `iteration`. Must be a pure
 * function of its arguments: the ranks of the first and the last stage call
 * it separately and must get the same bytes. May be called from the
 * backend's thread only. */
typedef zb_err (*zb_cpu_data_fn)(void *ud, int64_t iteration, int mb, int batch, int seq_len, uint8_t *tokens,
                                 uint8_t *targets, zb_diag *diag);

/* The same with the model's int32 token ids (a tokenized dataset,
 * train/zb_tokens.h), for vocabularies past 256. */
typedef zb_err (*zb_cpu_ids_fn)(void *ud, int64_t iteration, int mb, int batch, int seq_len, int32_t *tokens,
                                int32_t *targets, zb_diag *diag);

typedef struct zb_cpu_data {
  zb_cpu_data_fn fill;    /* fill or fill_ids required when the rank hosts the first or the last stage */
  void *ud;               /* borrowed */
  zb_cpu_ids_fn fill_ids; /* used instead of fill when set */
} zb_cpu_data;

/* The default data: byte-level language modelling over a text in memory.
 * Sequence j of microbatch mb of iteration i is the window of seq_len bytes
 * at an offset drawn from (seed, i, first_mb + mb, j); its targets are the
 * same window shifted by one byte (the next byte of the text). Needs a
 * vocab of 256 and len >= seq_len + 1. first_mb places a data-parallel
 * replica's microbatches in the global batch (replica x m: docs/model.md,
 * Data parallelism); 0 with one replica. */
typedef struct zb_cpu_text {
  const uint8_t *text; /* borrowed; must outlive every backend that reads it */
  size_t len;
  uint64_t seed;
  int first_mb; /* the global batch's index of this source's microbatch 0 */
} zb_cpu_text;

/* The zb_cpu_data_fn of a zb_cpu_text (ud: const zb_cpu_text *): use
 * (zb_cpu_data){zb_backend_cpu_text_fill, &text}. ZB_ERR_INVALID_ARG when
 * the text is shorter than seq_len + 1 bytes. Does not block. */
zb_err zb_backend_cpu_text_fill(void *ud, int64_t iteration, int mb, int batch, int seq_len, uint8_t *tokens,
                                uint8_t *targets, zb_diag *diag);

typedef struct zb_cpu_backend_config {
  int rank; /* for messages */
  /* The global indices of the stages this rank hosts, any order, no
   * duplicates (loop placement: s with s mod p == rank; V: rank and
   * 2p-1-rank); copied. n_stages >= 1. */
  const int *stages;
  int n_stages;
  int total_stages; /* S = p*v: the model's layers are split over S stages */
  /* The whole model (every rank must pass the same one); loss_scale 1/m
   * for the mean over an iteration's m microbatches. */
  zb_model_config model;
  zb_cpu_data data; /* tokens and targets for the first and the last stage */
  /* The device the model runs on (zb_device.h; borrowed, must outlive the
   * backend): NULL gives the backend a host device of its own (backend
   * "cpu"); a CUDA device makes it backend "cuda". */
  zb_device *device;
  /* With a device: the transport moves host memory (tcp), so buffer()
   * hands out host copies and the backend copies across, synchronously
   * for a SEND and before the consuming op for a RECV. */
  bool host_transport;
  int threads;             /* CBLAS threads, process-wide; <= 0 leaves the setting (1 by default) */
  const atomic_bool *stop; /* may be NULL; borrowed, must outlive the backend */
  /* A testing aid: when on, B of microbatch mb on the last stage in
   * iteration `iteration` starts from a NaN loss gradient
   * (zb_model_inject_nan), so the optimizer's NaN/Inf check must catch it. */
  struct {
    bool on;
    int64_t iteration;
    int mb;
  } inject_nan;
} zb_cpu_backend_config;

/* Bytes of one activation or gradient message of this model:
 * batch*seq_len*hidden*4 (what bytes_per_activation must be). 0 for a
 * non-positive shape. Does not block. */
size_t zb_backend_cpu_bytes_per_activation(const zb_model_config *model);

/* Creates a cpu backend: one model stage per hosted stage, parameters
 * initialised from model.seed (the same on every partition), gradients zero,
 * iteration 0. Caller owns *out (zb_backend_free). Does not block (beyond
 * the initialisation). ZB_ERR_INVALID_ARG for a bad stage list, model
 * shape, or a missing data source where the first or last stage is hosted. */
zb_err zb_backend_cpu_new(const zb_cpu_backend_config *cfg, zb_backend **out, zb_diag *diag);

/* Starts iteration `iteration` (see above): zeroes every hosted stage's
 * gradients, forgets the losses, drops leftover microbatch states, and
 * makes F sample the data source at `iteration`. ZB_ERR_INVALID_ARG when b
 * is not a cpu backend. Does not block. */
zb_err zb_backend_cpu_begin_iteration(zb_backend *b, int64_t iteration, zb_diag *diag);

/* The mean loss over the microbatches whose last-stage F ran since
 * begin_iteration, summed in microbatch order (so the same for any
 * schedule); *count (may be NULL) is how many. *mean is NAN when none ran.
 * F leaves each loss on the device, so this reads them all with one copy
 * and one host sync (blocks until the stage's device has computed them).
 * ZB_ERR_INVALID_ARG when b is not a cpu backend or does not host the last
 * stage; a device error as the model reports it. */
zb_err zb_backend_cpu_loss(zb_backend *b, double *mean, int *count, zb_diag *diag);

/* Number of stages b hosts (0 when b is not a cpu backend). */
int zb_backend_cpu_n_stages(const zb_backend *b);

/* The i-th hosted stage in ascending stage order (0 <= i < n_stages), its
 * global index in *stage (may be NULL); NULL when out of range or b is not a
 * cpu backend. Borrowed from b: read and write its parameters and gradients
 * through zb_model.h (zb_model_params, zb_model_grads, zb_model_tensor_at)
 * between iterations, never while an op runs. */
zb_model_stage *zb_backend_cpu_stage(zb_backend *b, int i, int *stage);

/* The hosted stage with global index `stage`, or NULL when b does not host
 * it (or is not a cpu backend). Borrowed as above. */
zb_model_stage *zb_backend_cpu_find_stage(zb_backend *b, int stage);

/* Bytes a cpu backend holds, summed over its stages. */
typedef struct zb_cpu_backend_mem {
  int64_t state_bytes;      /* microbatch states now (what take_stats reports as mem_bytes) */
  int64_t peak_state_bytes; /* highest state_bytes since creation, over the whole rank */
  int64_t slot_bytes;       /* SEND/RECV slots allocated so far (kept for reuse) */
  int64_t param_bytes;      /* parameters and gradients */
  int64_t workspace_bytes;  /* the stages' scratch */
} zb_cpu_backend_mem;

/* Fills *out; ZB_ERR_INVALID_ARG when b is not a cpu backend. Does not block. */
zb_err zb_backend_cpu_mem(const zb_backend *b, zb_cpu_backend_mem *out, zb_diag *diag);

#endif
