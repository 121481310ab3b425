/* bench_model.h — what zb_bench_model's sections share (bench_model.c,
 * bench_model_torch.c): its options and the model they describe. */
#ifndef ZB_BENCH_MODEL_H
#define ZB_BENCH_MODEL_H

#include "zb_arch.h"
#include "zb_model.h"

typedef struct bench_model_opts {
  int reps, threads;
  int rounds;       /* PyTorch section: rounds alternating zb and PyTorch */
  int layers;       /* blocks of the stage the stage sections time */
  int model_layers; /* blocks of the whole model the PyTorch comparison trains */
  int seq, batch;
  zb_arch arch;             /* kind and sizes; each section sets .layers */
  const char *sections;     /* comma-separated: stages, attention, memory, torch */
  const char *torch_python; /* --torch-python; NULL: ZB_TORCH_PYTHON, then a venv (bench_model_torch.c) */
  const char *torch_script; /* bench/torch_model.py */
} bench_model_opts;

/* The model config of o with `layers` blocks in all. *arch receives o's
 * architecture at that depth and must outlive the stages made from the
 * config (for builtin, config.arch is NULL: the builtin model as
 * zb_model.h makes it). */
zb_model_config bench_model_config(const bench_model_opts *o, int layers, zb_arch *arch);

/* Whether section `name` is among o->sections. */
int bench_section_on(const bench_model_opts *o, const char *name);

/* zb against PyTorch: the whole model's training step (F + B + W of one
 * microbatch) timed in this process, then bench/torch_model.py timing the
 * same model under a python with torch, and zb / PyTorch tokens/s. Says
 * why and returns when no such python is found. */
void bench_torch_section(const bench_model_opts *o);

#endif
