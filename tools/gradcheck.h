/* gradcheck.h — zb-gradcheck's parts (see gradcheck.c for what the tool
 * does): gradcheck.c reads the options and the dump directory,
 * gradcheck_check.c checks one iteration's dumps against the reference,
 * gradcheck_report.c prints what a check found (a table line or JSON).
 * Everything here belongs to the one process; nothing is shared between
 * threads. */
#ifndef ZB_GRADCHECK_H
#define ZB_GRADCHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PREFIX "zb-gradcheck: "

typedef struct gc_opts {
  double tol;
  int iteration; /* -1: every iteration present */
  const char *data;
  const char *dir;
  bool json, quiet;
} gc_opts;

/* One dump file: its header's iteration and stage (the first pass reads
 * and verifies every file, then keeps only these). */
typedef struct gc_file {
  char *path;
  int iteration, stage;
  bool named; /* the name has the writer's form it<N>-stage<S>.dump */
  int name_iteration, name_stage;
} gc_file;

/* The text file, read once for every iteration that names it. */
typedef struct gc_text {
  char *path;
  uint8_t *bytes;
  size_t len;
} gc_text;

/* One iteration's check and what it reports. */
typedef struct gc_iter {
  const gc_opts *o;
  int iteration;
  char job_id[64];
  int stages, microbatches, tensors;
  size_t params;
  bool mapped;   /* every tensor found once: tensors and params hold */
  bool compared; /* the reference ran: the errors and loss_ref hold */
  bool abs_used; /* some g_ref was zero: its error is absolute */
  double max_rel;
  char worst[64];
  double loss, loss_ref, loss_rel;
  int init;        /* iteration 0: 1 identical, 0 differs; -1 not checked */
  bool skipped;    /* every stage skipped its step: not compared */
  int status;      /* 0 pass, 1 mismatch or inconsistent, 2 could not check */
  char error[512]; /* the first error, for --json */
} gc_iter;

/* Checks the nf files of one iteration (sorted by stage) and reports the
 * result; returns 0, 1 or 2 (the exit status it calls for). text caches
 * the text file across iterations (the caller frees its path and bytes). */
int gc_check_iteration(const gc_opts *o, const gc_file *f, int nf, gc_text *text);

/* Prints it: one JSON object with --json, else a summary line. */
void gc_report(const gc_iter *it);

#endif
