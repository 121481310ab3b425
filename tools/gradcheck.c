/* zb-gradcheck: the numerical oracle of pipelined training. A cpu job with
 * model.dump_dir leaves, for each dumped iteration, one file per pipeline
 * stage (zb_dump.h): the stage's weights before the step, the gradients
 * the iteration accumulated (loss_scale 1/m: the gradient of the mean loss,
 * before clipping) and the weights after. This tool recomputes the same
 * iteration in one process without pipelining: the whole model as one
 * stage, the dumped weights, the same microbatches of the same text
 * (zb_backend_cpu_text_fill, as the workers sample it). It then compares
 * every tensor's gradient and the mean loss.
 *
 * The model computes an op's bits the same on any partition, so an honest
 * pipelined gradient differs from the reference only by the fp32 rounding
 * of the order in which the W ops accumulated it (about 1e-7 relative). A
 * microbatch dropped or counted twice, an activation or gradient sent to
 * the wrong stage or microbatch, a tensor lost or duplicated by the
 * partition, or a loss averaged wrongly shows up as an error of order
 * 1e-3 to 1, far above the default tolerance of 1e-5.
 *
 * Exit status: 0 when every checked iteration matches; 1 when one does not
 * or its files are inconsistent (a stage missing or twice, a tensor on no
 * stage or on two); 2 for a usage error or input that cannot be read. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "zb_alloc.h"
#include "zb_dump.h"

static const char usage_text[] =
    "usage: zb-gradcheck [--tolerance T] [--iteration N] [--data FILE] [--json] [--quiet]\n"
    "                    JOB_DUMP_DIR\n"
    "       zb-gradcheck --help\n"
    "\n"
    "Checks the gradient dumps of a cpu job (the job spec's model.dump_dir):\n"
    "JOB_DUMP_DIR is DIR/JOB_ID, holding it<N>-stage<S>.dump (and, for a job of\n"
    "data_parallel d > 1, replica K's it<N>-stage<S>-replica<K>.dump). For each dumped\n"
    "iteration it recomputes the iteration in one process without pipelining\n"
    "(the whole model as one stage, the weights the dumps hold from before the\n"
    "step, the same microbatches of the same text) and compares every tensor's\n"
    "gradient, ||g - g_ref|| / ||g_ref|| (the absolute ||g - g_ref|| where\n"
    "g_ref is zero), and the iteration's mean loss with the tolerance. The\n"
    "dumped weights of iteration 0 must equal the seeded initialisation bit\n"
    "for bit. An iteration whose step every stage skipped (non-finite\n"
    "gradients) is reported and not compared. With d > 1 the reference is the\n"
    "global batch (replica K's microbatch j is the batch's K x m + j), replica\n"
    "0's dumps are compared with it, every other replica's weights, gradients\n"
    "and grad norm must equal replica 0's bit for bit, and each replica's loss\n"
    "must match the reference's over its own microbatches.\n"
    "\n"
    "  --tolerance T  largest relative error that passes (default 1e-05)\n"
    "  --iteration N  check iteration N only (default: every iteration present)\n"
    "  --data FILE    the text file to sample (default: the path the dumps\n"
    "                 record, as the workers saw it)\n"
    "  --json         one JSON object per iteration on stdout, nothing else\n"
    "  --quiet        print only the summary line of each iteration\n"
    "  --help         print this text\n"
    "\n"
    "Exit status: 0 every checked iteration matches; 1 one does not, or its\n"
    "files are inconsistent (a stage missing or twice, a tensor on no stage,\n"
    "on two or of another shape); 2 a usage error or input that cannot be\n"
    "read (no dumps, a damaged dump, the text file).\n";

static int file_cmp(const void *a, const void *b) {
  const gc_file *x = a, *y = b;
  if (x->iteration != y->iteration)
    return x->iteration < y->iteration ? -1 : 1;
  if (x->replica != y->replica)
    return x->replica < y->replica ? -1 : 1;
  if (x->stage != y->stage)
    return x->stage < y->stage ? -1 : 1;
  return strcmp(x->path, y->path);
}

/* Lists the directory's *.dump files (not the writers' *.tmp.* files),
 * loads each once (a damaged one ends the run: exit 2) and keeps its
 * iteration and stage. With --iteration, files named for another
 * iteration are not read. Returns 0 or 2. */
static int scan_dir(const gc_opts *o, gc_file **out, int *n_out) {
  *out = NULL;
  *n_out = 0;
  DIR *dir = opendir(o->dir);
  if (!dir) {
    fprintf(stderr, PREFIX "cannot open '%s': %s\n", o->dir, strerror(errno));
    return 2;
  }
  gc_file *files = NULL;
  int n = 0, cap = 0, rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(dir))) {
    const char *name = e->d_name;
    size_t len = strlen(name);
    if (len < 5 || strcmp(name + len - 5, ".dump") != 0 || strstr(name, ".tmp."))
      continue;
    gc_file f = {0};
    int end = 0;
    f.named = sscanf(name, "it%d-stage%d.dump%n", &f.name_iteration, &f.name_stage, &end) == 2 &&
              (size_t)end == len;
    if (!f.named) /* a data-parallel replica's (zb_dump.h) */
      f.named = sscanf(name, "it%d-stage%d-replica%d.dump%n", &f.name_iteration, &f.name_stage,
                       &f.name_replica, &end) == 3 &&
                (size_t)end == len && f.name_replica > 0;
    if (f.named && o->iteration >= 0 && f.name_iteration != o->iteration)
      continue;
    size_t plen = strlen(o->dir) + 1 + len + 1;
    f.path = zb_malloc(plen);
    snprintf(f.path, plen, "%s/%s", o->dir, name);
    zb_dump d;
    zb_diag diag = {{0}};
    if (zb_dump_load(NULL, f.path, &d, &diag) != ZB_OK) {
      fprintf(stderr, PREFIX "%s\n", diag.msg);
      free(f.path);
      rc = 2;
      break;
    }
    f.iteration = d.iteration;
    f.stage = d.stage;
    f.replica = d.replica;
    zb_dump_free(&d);
    if (o->iteration >= 0 && f.iteration != o->iteration) {
      free(f.path);
      continue;
    }
    if (n == cap)
      files = zb_realloc(files, sizeof *files * (size_t)(cap = cap ? 2 * cap : 16));
    files[n++] = f;
  }
  closedir(dir);
  if (!rc && n == 0) {
    if (o->iteration >= 0)
      fprintf(stderr, PREFIX "no dumps of iteration %d in '%s'\n", o->iteration, o->dir);
    else
      fprintf(stderr, PREFIX "no dump files (*.dump) in '%s'\n", o->dir);
    rc = 2;
  }
  if (rc) {
    for (int i = 0; i < n; i++)
      free(files[i].path);
    free(files);
    return rc;
  }
  qsort(files, (size_t)n, sizeof *files, file_cmp);
  *out = files;
  *n_out = n;
  return 0;
}

/* ---- main --------------------------------------------------------------- */

int main(int argc, char **argv) {
  gc_opts o = {.tol = 1e-5, .iteration = -1};
  static const struct option opts[] = {{"tolerance", required_argument, NULL, 't'},
                                       {"iteration", required_argument, NULL, 'i'},
                                       {"data", required_argument, NULL, 'd'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"quiet", no_argument, NULL, 'q'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 't': {
      char *end;
      errno = 0;
      double v = strtod(optarg, &end);
      if (end == optarg || *end || errno || !isfinite(v) || v < 0) {
        fprintf(stderr, PREFIX "--tolerance takes a number >= 0, not '%s'\n", optarg);
        return 2;
      }
      o.tol = v;
      break;
    }
    case 'i': {
      char *end;
      errno = 0;
      long v = strtol(optarg, &end, 10);
      if (end == optarg || *end || errno || v < 0 || v > INT_MAX) {
        fprintf(stderr, PREFIX "--iteration takes an iteration number >= 0, not '%s'\n", optarg);
        return 2;
      }
      o.iteration = (int)v;
      break;
    }
    case 'd': o.data = optarg; break;
    case 'j': o.json = true; break;
    case 'q': o.quiet = true; break;
    case 'h': fputs(usage_text, stdout); return 0;
    default: fputs(usage_text, stderr); return 2;
    }
  }
  if (argc - optind != 1) {
    fprintf(stderr, PREFIX "%s\n%s", optind < argc ? "one JOB_DUMP_DIR, please" : "no JOB_DUMP_DIR given",
            usage_text);
    return 2;
  }
  o.dir = argv[optind];

  gc_file *files;
  int n;
  int rc = scan_dir(&o, &files, &n);
  if (rc)
    return rc;
  gc_text text = {0};
  for (int i = 0; i < n;) {
    int j = i;
    while (j < n && files[j].iteration == files[i].iteration)
      j++;
    int r = gc_check_iteration(&o, files + i, j - i, &text);
    rc = r > rc ? r : rc;
    i = j;
  }
  for (int i = 0; i < n; i++)
    free(files[i].path);
  free(files);
  free(text.path);
  free(text.bytes);
  return rc;
}
