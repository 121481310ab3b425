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
  int iteration, stage, replica;
  bool named; /* the name has a writer's form: it<N>-stage<S>.dump or it<N>-stage<S>-replica<K>.dump */
  int name_iteration, name_stage, name_replica;
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
  int stages, microbatches, tensors; /* microbatches: m, per replica */
  int data_parallel;                 /* d: the reference runs the global batch of d x m */
  int replicas_identical; /* d > 1: 1 every replica's dumps equal replica 0's bits, 0 not; -1 not checked */
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

/* Records a failure of status (1 or 2) and prints it to stderr
 * (gradcheck_check.c). */
__attribute__((format(printf, 3, 4))) void gc_fail(gc_iter *it, int status, const char *fmt, ...);

/* gradcheck_replicas.c: with data_parallel d > 1, the dumps of replicas
 * 1..d-1 (f, d: nf files sorted by replica then stage) against replica
 * 0's (f0, d0: nf0, sorted by stage): every replica dumped every stage
 * once, with the same model, and its weights before and after the step,
 * its gradients, grad norm and step flags bit-identical to replica 0's;
 * its loss (the mean over its own microbatches) within the tolerance of
 * the reference's losses mb_loss[k*m .. k*m+m-1] (NULL: not compared).
 * Sets it->replicas_identical. */
struct zb_dump;
void gc_check_replicas(gc_iter *it, const gc_file *f0, const struct zb_dump *d0, int nf0, const gc_file *f,
                       const struct zb_dump *d, int nf, const double *mb_loss);

/* Checks the nf files of one iteration (sorted by replica, then stage) and reports the
 * result; returns 0, 1 or 2 (the exit status it calls for). text caches
 * the text file across iterations (the caller frees its path and bytes). */
int gc_check_iteration(const gc_opts *o, const gc_file *f, int nf, gc_text *text);

/* Prints it: one JSON object with --json, else a summary line. */
void gc_report(const gc_iter *it);

#endif
