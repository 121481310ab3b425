/* bench_model_torch.c — zb_bench_model's comparison with PyTorch
 * (bench_model.h; docs/model.md, BLAS and speed): the tokens per second of
 * one training step of the whole model, zb's in this process and
 * PyTorch's from bench/torch_model.py run under a python that imports
 * torch, and their ratio.
 *
 * Both sides time the same work: one microbatch of batch x seq tokens
 * through every block, the loss and the gradients of the input and of
 * every weight, without an optimizer step. zb: a single stage holding the
 * whole model (stage 0 of 1), F (with the loss), B and W, each timed; the
 * step is their sum in one round. PyTorch: forward and the loss, then
 * loss.backward() (B and W in one pass). Each side: two warm-up steps,
 * then the best of --reps steps, in each of --rounds rounds that
 * alternate zb and PyTorch (never both at once); same thread count (CBLAS
 * threads here, torch.set_num_threads there).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_model.h"
#include "zb_alloc.h"
#include "zb_clock.h"

/* One step's F, B, W and their sum, in seconds. */
typedef struct step_times {
  double f, b, w, step;
} step_times;

/* zb's best step of o->reps (after two warm-up steps) into *best; 0, or
 * -1 after printing why. */
static int zb_step(const bench_model_opts *o, step_times *best) {
  zb_arch arch;
  zb_model_config cfg = bench_model_config(o, o->model_layers, &arch);
  zb_model_stage *st = NULL;
  zb_diag d = {{0}};
  if (zb_model_stage_new(&cfg, 0, 1, &st, &d) != ZB_OK) {
    printf("zb: cannot create the model: %s\n", d.msg);
    return -1;
  }
  size_t nt = (size_t)o->batch * o->seq;
  int32_t *tok = zb_malloc((nt + 1) * sizeof *tok);
  for (size_t i = 0; i <= nt; i++)
    tok[i] = (int32_t)((i * 7919) % (size_t)o->arch.vocab);
  *best = (step_times){1e30, 1e30, 1e30, 1e30};
  int rc = 0;
  for (int r = 0; r < o->reps + 2 && rc == 0; r++) { /* two warm-up steps */
    float loss = 0;
    double t0 = zb_clock_s();
    rc |= zb_model_forward(st, 0, tok, NULL, tok + 1, NULL, &loss, &d) != ZB_OK;
    double t1 = zb_clock_s();
    rc |= zb_model_backward_b(st, 0, NULL, NULL, &d) != ZB_OK;
    double t2 = zb_clock_s();
    rc |= zb_model_backward_w(st, 0, &d) != ZB_OK;
    double t3 = zb_clock_s();
    if (r >= 2 && t3 - t0 < best->step)
      *best = (step_times){t1 - t0, t2 - t1, t3 - t2, t3 - t0};
  }
  if (rc)
    printf("zb: a step failed: %s\n", d.msg);
  free(tok);
  zb_model_stage_free(st);
  return rc ? -1 : 0;
}

/* The python to run torch_model.py with: --torch-python, ZB_TORCH_PYTHON,
 * the venv of scripts/install-hf-venv.sh (ZB_HF_VENV, or build/venv-hf
 * of the source tree); NULL if none is given or executable. */
static const char *find_python(const bench_model_opts *o, char *buf, size_t cap) {
  if (o->torch_python)
    return o->torch_python;
  const char *env = getenv("ZB_TORCH_PYTHON");
  if (env && env[0])
    return env;
  const char *venv = getenv("ZB_HF_VENV");
  snprintf(buf, cap, "%s/bin/python", venv && venv[0] ? venv : ZB_DEFAULT_HF_VENV);
  return access(buf, X_OK) == 0 ? buf : NULL;
}

/* Runs argv (argv[0] a path) with its stdout and stderr into out (cut at
 * cap, NUL-terminated); its exit status, or -1 if it did not run. */
static int run_capture(char *const argv[], char *out, size_t cap) {
  int fd[2];
  if (pipe(fd) != 0)
    return -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    close(fd[0]);
    close(fd[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(fd[1], STDOUT_FILENO);
    dup2(fd[1], STDERR_FILENO);
    close(fd[0]);
    close(fd[1]);
    execv(argv[0], argv);
    _exit(127);
  }
  close(fd[1]);
  size_t n = 0;
  char chunk[4096];
  ssize_t k;
  while ((k = read(fd[0], chunk, sizeof chunk)) > 0) /* read to the end, keep what fits */
    for (ssize_t i = 0; i < k && n + 1 < cap; i++)
      out[n++] = chunk[i];
  out[n] = 0;
  close(fd[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid)
    return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* PyTorch's best step from torch_model.py in seconds: forward (with the
 * loss) in ->f, backward in ->b, their sum in ->step (0 when it did not
 * run; it prints why). */
static void torch_step(const bench_model_opts *o, const char *python, step_times *t) {
  char a[11][16];
  const int v[11] = {o->arch.vocab,
                     o->arch.hidden,
                     o->arch.heads,
                     o->arch.kv_heads,
                     o->arch.intermediate,
                     o->model_layers,
                     o->seq,
                     o->batch,
                     o->threads,
                     o->reps,
                     0};
  for (int i = 0; i < 10; i++)
    snprintf(a[i], sizeof a[i], "%d", v[i]);
  char *argv[] = {(char *)python,
                  (char *)o->torch_script,
                  "--arch",
                  (char *)zb_arch_kind_name(o->arch.kind),
                  "--vocab",
                  a[0],
                  "--hidden",
                  a[1],
                  "--heads",
                  a[2],
                  "--kv-heads",
                  a[3],
                  "--intermediate",
                  a[4],
                  "--layers",
                  a[5],
                  "--seq",
                  a[6],
                  "--batch",
                  a[7],
                  "--threads",
                  a[8],
                  "--reps",
                  a[9],
                  NULL};
  char out[8192];
  int rc = run_capture(argv, out, sizeof out);
  const char *res = strstr(out, "torch_model: step_ms=");
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
    printf("  | %s\n", line);
  double ms[3];
  *t = (step_times){0};
  if (rc != 0 || !res ||
      sscanf(res, "torch_model: step_ms=%lf forward_ms=%lf backward_ms=%lf", &ms[0], &ms[1], &ms[2]) != 3) {
    printf("PyTorch: skipped (%s %s exited %d%s)\n", python, o->torch_script, rc,
           rc == 3 ? ": torch or transformers does not import" : "");
    return;
  }
  *t = (step_times){.f = ms[1] * 1e-3, .b = ms[2] * 1e-3, .step = ms[0] * 1e-3};
}

void bench_torch_section(const bench_model_opts *o) {
  if (o->arch.kind != ZB_ARCH_BUILTIN && o->arch.kind != ZB_ARCH_LLAMA) {
    printf("\nzb against PyTorch: only for --arch builtin or llama\n");
    return;
  }
  double tokens = (double)o->batch * o->seq;
  printf("\nzb against PyTorch: one training step of the whole model (%d blocks, %s) on one microbatch of "
         "%.0f tokens,\nno optimizer; zb: F + B + W of one stage holding it all; PyTorch: forward + loss + "
         "backward (bench/torch_model.py);\n%d thread(s) each; %d round(s) alternating the two, each side's "
         "best of %d steps after 2 warm-up steps per round;\nshown: each side's best step (its F + B + W)\n",
         o->model_layers, zb_arch_kind_name(o->arch.kind), tokens, o->threads, o->rounds, o->reps);
  char buf[4096];
  const char *python = find_python(o, buf, sizeof buf);
  if (!python)
    printf("PyTorch: skipped (no python with torch: --torch-python PATH, ZB_TORCH_PYTHON, or "
           "scripts/install-hf-venv.sh)\n");
  /* --rounds alternate the two sides, so that a stretch of load from
   * other processes on a shared machine is less likely to hit one only */
  step_times zb = {1e30, 1e30, 1e30, 1e30}, pt = {0};
  for (int r = 0; r < o->rounds; r++) {
    step_times z, t = {0};
    if (zb_step(o, &z) != 0)
      return;
    zb = z.step < zb.step ? z : zb;
    if (python)
      torch_step(o, python, &t);
    if (t.step > 0 && (pt.step <= 0 || t.step < pt.step))
      pt = t;
  }
  printf("%-8s %9s %9s %9s %10s %11s\n", "", "F ms", "B ms", "W ms", "step ms", "tokens/s");
  printf("%-8s %9.2f %9.2f %9.2f %10.2f %11.0f\n", "zb", zb.f * 1e3, zb.b * 1e3, zb.w * 1e3, zb.step * 1e3,
         tokens / zb.step);
  if (pt.step <= 0)
    return;
  /* backward does B and W at once: its time stands under B */
  printf("%-8s %9.2f %9.2f %9s %10.2f %11.0f\n", "PyTorch", pt.f * 1e3, pt.b * 1e3, "(in B)", pt.step * 1e3,
         tokens / pt.step);
  printf("zb / PyTorch tokens/s: %.2f\n", pt.step / zb.step);
}
