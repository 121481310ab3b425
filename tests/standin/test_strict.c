/* test_strict.c — the stricter stand-in's checks, each shown to catch the
 * bug it exists for (test-only; docs/model.md, The CPU stand-in): a host
 * read of a device pointer faults; a kernel on a block freed through zb's
 * allocator, or one element past a block, is refused by name; a missing
 * event wait reads stale data under the delay knob; an injected failure is
 * reported by zb naming the call.
 *
 * `test_strict workload` runs a representative piece of the GPU path (the
 * cuda device's copies, GEMM, kernels and events; a device optimizer step
 * with rollback) and exits 1 at its first error, printing zb's message:
 * fail_sweep.py runs it failing each call site in turn.
 */
#include <cuda_runtime.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "standin.h"
#include "zb_cuda_kernels.h"
#include "zb_device.h"
#include "zb_step_device.h"
#include "zbtest.h"

static zb_device *cuda_dev(void) {
  zb_device *d = NULL;
  zb_diag diag = {{0}};
  zb_cuda_device_config cfg = {0, ZB_PRECISION_FP32};
  if (zb_device_cuda_new(&cfg, &d, &diag) != ZB_OK)
    fprintf(stderr, "cuda device: %s\n", diag.msg);
  return d;
}

/* ---- a host read of a device pointer ---- */

static volatile void *g_fault_lo, *g_fault_hi;

static void on_segv(int sig, siginfo_t *si, void *uc) {
  (void)sig, (void)uc;
  bool inside = si->si_addr >= (void *)g_fault_lo && si->si_addr < (void *)g_fault_hi;
  _exit(inside ? 42 : 43);
}

/* The child reads through the pointer cudaMalloc gave: SIGSEGV at that
 * address (42), as on a GPU; 0 would mean the host read it. */
static int child_reads(bool device) {
  float *p;
  if ((device ? cudaMalloc((void **)&p, 256) : cudaMallocHost((void **)&p, 256)) != cudaSuccess)
    return 2;
  g_fault_lo = p;
  g_fault_hi = (char *)p + 256;
  struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
  sigaction(SIGSEGV, &sa, NULL);
  volatile float x = p[3];
  (void)x;
  return 0;
}

static int status_of(bool device) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0)
    _exit(child_reads(device));
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_host_read_faults(void) {
  CHECK_EQ(status_of(true), 42); /* device memory: the read faults at p */
  CHECK_EQ(status_of(false), 0); /* pinned host memory stays readable */
}

/* ---- use after free and overruns through zb's allocator ---- */

static void test_use_after_free_named(void) {
  zb_device *d = cuda_dev();
  CHECK(d);
  zb_diag diag = {{0}};
  float *p;
  CHECK_EQ(d->ops->alloc(d->self, 64 * sizeof(float), (void **)&p, &diag), ZB_OK);
  CHECK_EQ(d->ops->zero(d->self, p, 64 * sizeof(float), &diag), ZB_OK);
  d->ops->free(d->self, p);
  /* the bug: a kernel on the block just freed (a caching allocator keeps it live) */
  CHECK(d->ops->scale(d->self, p, 2.0f, 64, &diag) != ZB_OK);
  CHECK_MSG(strstr(diag.msg, "zbk_scale") != NULL, "%s", diag.msg);
  CHECK_MSG(strstr(standin_last_error(), "already freed") != NULL, "%s", standin_last_error());
  zb_device_free(d);
}

static void test_overrun_named(void) {
  zb_device *d = cuda_dev();
  CHECK(d);
  zb_diag diag = {{0}};
  float *p;
  CHECK_EQ(d->ops->alloc(d->self, 63 * sizeof(float), (void **)&p, &diag), ZB_OK);
  CHECK_EQ(d->ops->scale(d->self, p, 2.0f, 63, &diag), ZB_OK);
  /* the bug: one element past the block (a size class would round it to 512 bytes) */
  CHECK(d->ops->scale(d->self, p, 2.0f, 64, &diag) != ZB_OK);
  CHECK_MSG(strstr(standin_last_error(), "out of bounds") != NULL, "%s", standin_last_error());
  d->ops->free(d->self, p);
  zb_device_free(d);
}

/* ---- a missing synchronisation under the delay knob ---- */

/* x = 1, then x *= 2 five times on s1; s2 copies x to pinned memory,
 * waiting for s1's event or not. Each item waits the delay first, so
 * without the wait the copy runs while s1 is at its first or second. */
static float copy_after(bool wait) {
  cudaStream_t s1, s2;
  cudaEvent_t ev;
  float *x, *host, out = -1;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  cudaEventCreate(&ev);
  cudaMalloc((void **)&x, sizeof(float));
  cudaMallocHost((void **)&host, sizeof(float));
  float one = 1.0f;
  cudaMemcpy(x, &one, sizeof one, cudaMemcpyHostToDevice);
  for (int i = 0; i < 5; i++)
    zbk_scale(s1, x, 2.0f, 1);
  cudaEventRecord(ev, s1);
  if (wait)
    cudaStreamWaitEvent(s2, ev, 0);
  cudaMemcpyAsync(host, x, sizeof(float), cudaMemcpyDeviceToHost, s2);
  if (cudaStreamSynchronize(s2) == cudaSuccess)
    out = *host;
  cudaDeviceSynchronize();
  cudaFreeHost(host);
  cudaFree(x);
  cudaEventDestroy(ev);
  cudaStreamDestroy(s2);
  cudaStreamDestroy(s1);
  return out;
}

static void test_missing_wait_reads_stale(void) {
  standin_set_delay_us(20000);
  float without = copy_after(false), with = copy_after(true);
  standin_set_delay_us(0);
  CHECK_MSG(without < 32.0f, "without the wait: %g (the delay should make it stale)", (double)without);
  CHECK_MSG(with == 32.0f, "with the wait: %g", (double)with);
}

/* ---- error injection ---- */

static void test_injected_failures_named(void) {
  static const char *const apis[] = {"cudaMalloc", "cudaMemsetAsync", "zbk_scale"};
  for (int i = 0; i < 3; i++) {
    char spec[64];
    snprintf(spec, sizeof spec, "%s:1", apis[i]);
    zb_device *d = cuda_dev();
    CHECK(d);
    standin_fail_set(spec);
    zb_diag diag = {{0}};
    float *p = NULL;
    zb_err err = d->ops->alloc(d->self, 64, (void **)&p, &diag);
    if (!err)
      err = d->ops->zero(d->self, p, 64, &diag);
    if (!err)
      err = d->ops->scale(d->self, p, 2.0f, 16, &diag);
    standin_fail_set(NULL);
    CHECK_MSG(err != ZB_OK && strstr(diag.msg, apis[i]), "%s: %s", apis[i], diag.msg);
    CHECK(standin_fail_fired() == NULL); /* standin_fail_set forgot it */
    d->ops->free(d->self, p);
    zb_device_free(d);
  }
}

/* ---- the sweep's workload ---- */

#define WANT(expr)                                                                                           \
  do {                                                                                                       \
    if ((err = (expr)) != ZB_OK)                                                                             \
      goto out;                                                                                              \
  } while (0)

enum { N = 96 };

/* Copies, GEMM, kernels and events on the cuda device; x, y, w are N floats. */
static zb_err device_ops(zb_device *d, float *x, float *y, float *w, zb_diag *diag) {
  const zb_device_ops *o = d->ops;
  float host[N];
  for (int i = 0; i < N; i++)
    host[i] = (float)i / N;
  zb_device_event *e0 = NULL, *e1 = NULL;
  zb_err err;
  WANT(o->copy(d->self, x, host, sizeof host, ZB_COPY_H2D, diag));
  WANT(o->zero(d->self, y, sizeof host, diag));
  WANT(o->copy(d->self, w, x, sizeof host, ZB_COPY_D2D, diag));
  WANT(o->event_new(d->self, &e0, diag));
  WANT(o->event_new(d->self, &e1, diag));
  WANT(o->event_record(d->self, e0, diag));
  zb_gemm g = {
      .m = 8, .n = 8, .k = 8, .alpha = 1, .a = x, .lda = 8, .b = w, .ldb = 8, .c = y, .ldc = 8, .batch = 1};
  WANT(o->gemm(d->self, &g, diag));
  WANT(o->gelu_fwd(d->self, y, w, N, diag));
  WANT(o->add(d->self, y, w, 0.5f, N, diag));
  WANT(o->scale(d->self, y, 0.25f, N, diag));
  WANT(o->event_record(d->self, e1, diag));
  WANT(o->sync(d->self, diag));
  float ms;
  WANT(o->event_elapsed_ms(d->self, e0, e1, &ms, diag));
  WANT(o->copy(d->self, host, y, sizeof host, ZB_COPY_D2H, diag));
  WANT(o->sync(d->self, diag));
out:
  if (e0)
    o->event_free(d->self, e0);
  if (e1)
    o->event_free(d->self, e1);
  return err;
}

/* One post-validated device optimizer step with rollback. */
static zb_err reduce_none(void *arg, zb_step_partial *p, zb_diag *diag) {
  (void)arg, (void)p, (void)diag;
  return ZB_OK;
}

static zb_err device_step(zb_device *d, float *params, float *grads, zb_diag *diag) {
  zb_adamw *opt = NULL;
  zb_step_device *t = NULL;
  zb_stepper *st = NULL;
  zb_adamw_config cfg = {.lr = 1e-3, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  zb_err err;
  WANT(zb_adamw_new(&cfg, N, &opt, diag));
  WANT(zb_step_device_new(d, 1, &opt, &params, (const float *const *)&grads, true, &t, diag));
  zb_step_target tgt = zb_step_device_target(t);
  WANT(zb_stepper_new_target(&tgt, 1.0, ZB_STEP_POST_VALIDATED, &st, diag));
  zb_step_result r;
  WANT(zb_stepper_run(st, reduce_none, NULL, &r, diag));
  WANT(zb_step_device_pull_state(t, diag));
  WANT(zb_step_device_push_state(t, diag));
out:
  zb_stepper_free(st);
  zb_step_device_free(t);
  zb_adamw_free(opt);
  return err;
}

static int workload(void) {
  zb_diag diag = {{0}};
  zb_device *d = NULL;
  zb_cuda_device_config cfg = {0, ZB_PRECISION_FP32};
  float *x = NULL, *y = NULL, *w = NULL;
  zb_err err;
  WANT(zb_device_cuda_new(&cfg, &d, &diag));
  WANT(d->ops->alloc(d->self, N * sizeof(float), (void **)&x, &diag));
  WANT(d->ops->alloc(d->self, N * sizeof(float), (void **)&y, &diag));
  WANT(d->ops->alloc(d->self, N * sizeof(float), (void **)&w, &diag));
  WANT(device_ops(d, x, y, w, &diag));
  WANT(device_step(d, x, y, &diag));
out:
  if (d) {
    d->ops->free(d->self, x);
    d->ops->free(d->self, y);
    d->ops->free(d->self, w);
    zb_device_free(d);
  }
  if (err)
    fprintf(stderr, "workload: error: %s\n", diag.msg);
  return err ? 1 : 0;
}

int zbt_failed_checks;

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "workload") == 0)
    return workload();
  static const zbt_case cases[] = {ZBT(test_host_read_faults), ZBT(test_use_after_free_named),
                                   ZBT(test_overrun_named), ZBT(test_missing_wait_reads_stale),
                                   ZBT(test_injected_failures_named)};
  return zbt_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}
