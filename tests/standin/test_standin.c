/* test_standin.c — the CPU stand-in of the CUDA runtime and cuBLAS
 * (tests/standin; docs/model.md, The CPU stand-in): each of its checks is
 * shown to fail when it should (host/device mix-up, wrong copy kind, out of
 * bounds, use after free, a read without synchronisation under the delay
 * knob) and to pass otherwise; streams run in order and concurrently;
 * events time and order; cuBLAS matches a naive column-major loop.
 * The sticky-error test runs in a child process (it poisons the device).
 */
#include <cublas_v2.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>

#include "standin.h"
#include "zb_cuda_kernels.h"
#include "zbtest.h"

extern char **environ;

static void *dalloc(size_t bytes) {
  void *p = NULL;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

static bool has(const char *needle) {
  return strstr(standin_last_error(), needle) != NULL;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

static void test_device_info(void) {
  int n = -1, v = 0;
  struct cudaDeviceProp p;
  CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == 1);
  CHECK(cudaSetDevice(0) == cudaSuccess);
  CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess); /* read and reset */
  CHECK(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
  CHECK_STREQ(p.name, STANDIN_DEVICE_NAME);
  CHECK_EQ(p.totalGlobalMem, (size_t)16 << 30);
  CHECK(p.major == 9 && p.minor == 0);
  CHECK(cudaDriverGetVersion(&v) == cudaSuccess && v == CUDART_VERSION);
  CHECK(standin_is_active());
  CHECK_STREQ(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue");
  CHECK_STREQ(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
}

/* A host pointer where a device pointer belongs, and the reverse. */
static void test_host_device_mixup(void) {
  float host[8] = {0}, back[8];
  float *d = dalloc(sizeof host);
  CHECK(d);
  CHECK(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice) == cudaSuccess); /* right: passes */
  CHECK(cudaMemsetAsync(host, 0, sizeof host, 0) == cudaErrorInvalidValue);
  CHECK(has("host memory, not a device allocation"));
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(standin_check_device(host, 4, "probe") == cudaErrorInvalidValue);
  CHECK(standin_check_device(d, sizeof host, "probe") == cudaSuccess);
  CHECK(!standin_is_device(host) && standin_is_device(d + 7) && !standin_is_device(d + 8));
  /* a kernel launcher and a GEMM are checked the same way */
  CHECK(zbk_scale(0, host, 2.0f, 8) == cudaErrorInvalidValue);
  CHECK(has("zbk_scale x") && has("host memory"));
  cublasHandle_t h;
  float one = 1, zero = 0;
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, host, 2, d, 2, &zero, d, 2) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(has("cublasSgemm A"));
  CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, d, 2, d, 2, &zero, d + 4, 2) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
  /* pinned host memory is host memory */
  float *pin = NULL;
  CHECK(cudaMallocHost((void **)&pin, sizeof host) == cudaSuccess);
  CHECK(cudaMemsetAsync(pin, 0, 4, 0) == cudaErrorInvalidValue && has("pinned host memory"));
  CHECK(cudaMemcpy(pin, d, sizeof host, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(memcmp(pin, back, sizeof back) == 0);
  CHECK(cudaFreeHost(d) == cudaErrorInvalidValue);
  CHECK(cudaFree(pin) == cudaErrorInvalidValue);
  CHECK(cudaFreeHost(pin) == cudaSuccess);
  CHECK(cudaFree(d) == cudaSuccess);
  cudaGetLastError();
}

/* Each cudaMemcpyKind promises which side is device memory. */
static void test_wrong_copy_kind(void) {
  float host[4] = {1, 2, 3, 4}, out[4] = {0};
  float *d = dalloc(sizeof host), *d2 = dalloc(sizeof host);
  CHECK(d && d2);
  CHECK(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice) == cudaSuccess);
  /* H2D whose source is device memory */
  CHECK(cudaMemcpy(d2, d, sizeof host, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(has("HostToDevice) source") && has("device memory where host memory belongs"));
  /* D2H whose destination is device memory */
  CHECK(cudaMemcpyAsync(d2, d, sizeof host, cudaMemcpyDeviceToHost, 0) == cudaErrorInvalidValue);
  CHECK(has("DeviceToHost) destination"));
  /* D2H whose source is host memory; D2D with a host side */
  CHECK(cudaMemcpy(out, host, sizeof host, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d2, host, sizeof host, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(out, d, sizeof host, (enum cudaMemcpyKind)7) == cudaErrorInvalidMemcpyDirection);
  /* cudaMemcpyDefault infers each side */
  CHECK(cudaMemcpy(d2, d, sizeof host, cudaMemcpyDefault) == cudaSuccess);
  CHECK(cudaMemcpy(out, d2, sizeof out, cudaMemcpyDefault) == cudaSuccess);
  CHECK(memcmp(out, host, sizeof out) == 0);
  CHECK(cudaFree(d) == cudaSuccess && cudaFree(d2) == cudaSuccess);
  cudaGetLastError();
}

static void test_out_of_bounds(void) {
  char host[64] = {0};
  char *d = dalloc(40);
  CHECK(d);
  CHECK(cudaMemcpy(d, host, 40, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemcpy(d, host, 41, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(has("runs 1 bytes past the end") && has("out of bounds"));
  CHECK(cudaMemcpy(host, d + 8, 33, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  /* 2D: 4 rows of 8 bytes at pitch 12 span 44 bytes */
  CHECK(cudaMemcpy2DAsync(d, 12, host, 16, 8, 4, cudaMemcpyHostToDevice, 0) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy2DAsync(d, 12, host, 16, 8, 3, cudaMemcpyHostToDevice, 0) == cudaSuccess);
  CHECK(cudaMemcpy2DAsync(d, 4, host, 16, 8, 3, cudaMemcpyHostToDevice, 0) == cudaErrorInvalidPitchValue);
  CHECK(cudaMemsetAsync(d + 39, 0, 2, 0) == cudaErrorInvalidValue);
  CHECK(zbk_gelu_fwd(0, (float *)d, (float *)d, 11) == cudaErrorInvalidValue && has("zbk_gelu_fwd"));
  /* a launch's status is cudaGetLastError's, so the refusal is still there */
  CHECK(zbk_gelu_fwd(0, (float *)d, (float *)d, 10) == cudaErrorInvalidValue);
  CHECK(zbk_gelu_fwd(0, (float *)d, (float *)d, 10) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cudaFree(d) == cudaSuccess);
  cudaGetLastError();
}

static void test_use_after_free(void) {
  float host[4] = {0};
  float *d = dalloc(sizeof host);
  CHECK(d);
  CHECK(cudaFree(d) == cudaSuccess);
  CHECK(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(has("use after free"));
  CHECK(cudaMemcpy(host, d + 1, 4, cudaMemcpyDefault) == cudaErrorInvalidValue && has("use after free"));
  CHECK(zbk_add(0, d, d, 1.0f, 4) == cudaErrorInvalidValue && has("use after free"));
  CHECK(cudaFree(d) == cudaErrorInvalidValue && has("use after free")); /* double free */
  float *in = dalloc(16);
  CHECK(cudaFree(in + 1) == cudaErrorInvalidValue); /* not the start */
  CHECK(cudaFree(host) == cudaErrorInvalidValue);
  CHECK(cudaFree(in) == cudaSuccess);
  cudaGetLastError();
}

/* cudaFreeAsync is stream-ordered: work queued before the free still
 * reads the memory (the delay knob holds it in the queue), a launch after
 * it is refused as a use after free at once, and once the stream got there
 * the freed bytes are poisoned. */
static void test_free_async(void) {
  enum { N = 16 };
  float in[N], *out = NULL;
  for (int i = 0; i < N; i++)
    in[i] = (float)i - 3;
  CHECK(cudaMallocHost((void **)&out, N * sizeof *out) == cudaSuccess && out);
  float *d = dalloc(sizeof in);
  cudaStream_t s;
  CHECK(d && cudaStreamCreate(&s) == cudaSuccess);
  CHECK(cudaMemcpy(d, in, sizeof in, cudaMemcpyHostToDevice) == cudaSuccess);
  standin_set_delay_us(20000);
  CHECK(zbk_scale(s, d, 2.0f, N) == cudaSuccess);
  CHECK(cudaMemcpyAsync(out, d, sizeof in, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(cudaFreeAsync(d, s) == cudaSuccess);
  CHECK(cudaStreamQuery(s) == cudaErrorNotReady); /* the free waits behind the queued work */
  cudaGetLastError();
  CHECK(zbk_scale(s, d, 2.0f, N) == cudaErrorInvalidValue && has("use after free"));
  CHECK(cudaFreeAsync(d, s) == cudaErrorInvalidValue && has("use after free")); /* double free */
  standin_set_delay_us(0);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  for (int i = 0; i < N; i++)
    CHECK_NEAR(out[i], in[i] * 2, 0);
  CHECK(cudaMemcpy(out, d, 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue && has("use after free"));
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaFreeHost(out) == cudaSuccess);
  cudaGetLastError();
}

/* The delay knob: a program that reads a D2H result in pinned memory
 * without synchronising sees stale data (asserted, so the knob is shown to
 * work), and with the synchronisation it reads the right values. (Into
 * pageable memory CUDA's cudaMemcpyAsync returns once the copy is done:
 * test_pageable_copies.) */
static void test_read_without_sync(void) {
  enum { N = 64 };
  float in[N], *out = NULL;
  CHECK(cudaMallocHost((void **)&out, N * sizeof *out) == cudaSuccess && out);
  for (int i = 0; i < N; i++)
    in[i] = (float)i + 1;
  float *d = dalloc(sizeof in);
  cudaStream_t s;
  CHECK(d && cudaStreamCreate(&s) == cudaSuccess);
  CHECK(cudaMemcpy(d, in, sizeof in, cudaMemcpyHostToDevice) == cudaSuccess);
  standin_set_delay_us(30000);
  for (int round = 0; round < 2; round++) {
    memset(out, 0, N * sizeof *out);
    CHECK(zbk_scale(s, d, 2.0f, N) == cudaSuccess);
    CHECK(cudaMemcpyAsync(out, d, N * sizeof *out, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    if (round == 0) { /* the missing sync: the result is not there yet */
      int stale = 0;
      for (int i = 0; i < N; i++)
        stale += out[i] != in[i] * 2;
      CHECK_MSG(stale == N, "read without sync saw %d of %d stale values; the delay knob did not delay",
                stale, N);
      CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
      CHECK(cudaGetLastError() == cudaErrorNotReady); /* left behind, as CUDA may: cleared */
    }
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    for (int i = 0; i < N; i++)
      CHECK_NEAR(out[i], in[i] * (round == 0 ? 2 : 4), 0);
  }
  standin_set_delay_us(0);
  CHECK(cudaStreamQuery(s) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaFree(d) == cudaSuccess);
  CHECK(cudaFreeHost(out) == cudaSuccess);
  cudaGetLastError();
}

/* Pageable host memory, as CUDA documents it: cudaMemcpyAsync to the
 * device has consumed the source when it returns (changing or freeing it
 * after is safe), and to the host it returns once the copy is done; both
 * under the delay knob, so neither passes by luck. */
static void test_pageable_copies(void) {
  enum { N = 32 };
  float *in = malloc(N * sizeof *in), out[N];
  float *d = dalloc(N * sizeof *in);
  cudaStream_t s;
  CHECK(in && d && cudaStreamCreate(&s) == cudaSuccess);
  for (int i = 0; i < N; i++)
    in[i] = (float)i;
  standin_set_delay_us(20000);
  CHECK(cudaMemcpyAsync(d, in, N * sizeof *in, cudaMemcpyHostToDevice, s) == cudaSuccess);
  for (int i = 0; i < N; i++)
    in[i] = -1.0f; /* after the call: must not reach the device */
  free(in);
  CHECK(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  for (int i = 0; i < N; i++) /* no synchronisation: the call itself waited */
    CHECK_NEAR(out[i], (float)i, 0);
  standin_set_delay_us(0);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaFree(d) == cudaSuccess);
}

/* ---- streams ---- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static int log_v[256], log_n;

static cudaError_t log_item(void *arg) {
  pthread_mutex_lock(&log_mu);
  log_v[log_n++] = (int)(intptr_t)arg;
  pthread_mutex_unlock(&log_mu);
  return cudaSuccess;
}

static atomic_int released;
static void count_release(void *arg) {
  (void)arg;
  atomic_fetch_add(&released, 1);
}

/* Waits up to 5 s for *flag; false on timeout (a test must not hang). */
static bool await(atomic_int *flag) {
  for (int i = 0; i < 5000 && !atomic_load(flag); i++)
    sleep_ms(1);
  return atomic_load(flag);
}

static atomic_int flag_a, flag_b, gate;

static cudaError_t rendezvous_a(void *arg) {
  (void)arg;
  atomic_store(&flag_a, 1);
  return await(&flag_b) ? cudaSuccess : cudaErrorLaunchFailure;
}

static cudaError_t rendezvous_b(void *arg) {
  (void)arg;
  atomic_store(&flag_b, 1);
  return await(&flag_a) ? cudaSuccess : cudaErrorLaunchFailure;
}

static cudaError_t wait_gate(void *arg) {
  (void)arg;
  return await(&gate) ? cudaSuccess : cudaErrorLaunchFailure;
}

static void test_streams(void) {
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreate(&s1) == cudaSuccess);
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  /* in order, asynchronously: nothing runs before the gate opens */
  log_n = 0;
  atomic_store(&gate, 0);
  atomic_store(&released, 0);
  CHECK(standin_enqueue(s1, wait_gate, NULL, NULL) == cudaSuccess);
  for (int i = 0; i < 100; i++)
    CHECK(standin_enqueue(s1, log_item, (void *)(intptr_t)i, count_release) == cudaSuccess);
  sleep_ms(20);
  pthread_mutex_lock(&log_mu);
  int early = log_n;
  pthread_mutex_unlock(&log_mu);
  CHECK_EQ(early, 0);
  CHECK(cudaStreamQuery(s1) == cudaErrorNotReady); /* while an item blocks */
  atomic_store(&gate, 1);
  CHECK(cudaStreamSynchronize(s1) == cudaSuccess);
  CHECK_EQ(log_n, 100);
  CHECK_EQ(atomic_load(&released), 100);
  for (int i = 0; i < 100; i++)
    CHECK_EQ(log_v[i], i);
  /* concurrent across streams: each item waits for the other */
  atomic_store(&flag_a, 0);
  atomic_store(&flag_b, 0);
  CHECK(standin_enqueue(s1, rendezvous_a, NULL, NULL) == cudaSuccess);
  CHECK(standin_enqueue(s2, rendezvous_b, NULL, NULL) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s1) == cudaSuccess && cudaStreamSynchronize(s2) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cudaStreamDestroy(s1) == cudaSuccess && cudaStreamDestroy(s2) == cudaSuccess);
  CHECK(standin_enqueue(s1, log_item, NULL, NULL) == cudaErrorInvalidResourceHandle);
}

static void test_events(void) {
  cudaStream_t s;
  cudaEvent_t a, b, nt;
  float ms = -1;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess);
  CHECK(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming) == cudaSuccess);
  CHECK(cudaEventQuery(a) == cudaSuccess); /* never recorded: complete */
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorInvalidResourceHandle);
  standin_set_delay_us(20000);
  CHECK(cudaEventRecord(a, s) == cudaSuccess);
  CHECK(standin_enqueue(s, log_item, NULL, NULL) == cudaSuccess);
  CHECK(cudaEventRecord(b, s) == cudaSuccess);
  CHECK(cudaEventRecord(nt, s) == cudaSuccess);
  CHECK(cudaEventQuery(b) == cudaErrorNotReady);
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorNotReady);
  CHECK(cudaEventSynchronize(b) == cudaSuccess);
  CHECK(cudaEventQuery(b) == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
  /* two delayed items (the op and b's marker) lie between the markers */
  CHECK_MSG(ms >= 2 * 20 * 0.99 && ms < 5000, "elapsed %.3f ms, expected >= 40", ms);
  CHECK(cudaEventSynchronize(nt) == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, a, nt) == cudaErrorInvalidResourceHandle);
  standin_set_delay_us(0);
  /* destroying an event with a marker in flight is allowed */
  atomic_store(&gate, 0);
  CHECK(standin_enqueue(s, wait_gate, NULL, NULL) == cudaSuccess);
  CHECK(cudaEventRecord(a, s) == cudaSuccess);
  CHECK(cudaEventDestroy(a) == cudaSuccess);
  CHECK(cudaEventQuery(a) == cudaErrorInvalidResourceHandle);
  atomic_store(&gate, 1);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaEventDestroy(b) == cudaSuccess && cudaEventDestroy(nt) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  cudaGetLastError();
}

static atomic_int shared_value;
static cudaError_t write_one(void *arg) {
  (void)arg;
  if (!await(&gate))
    return cudaErrorLaunchFailure;
  atomic_store(&shared_value, 1);
  return cudaSuccess;
}
static cudaError_t read_value(void *arg) {
  *(int *)arg = atomic_load(&shared_value);
  return cudaSuccess;
}

/* cudaStreamWaitEvent orders one stream after another; without it the
 * second stream reads too early (the control). */
static void test_stream_wait_event(void) {
  cudaStream_t s1, s2, s3;
  cudaEvent_t e;
  int with_wait = -1, without = -1;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  atomic_store(&gate, 0);
  atomic_store(&shared_value, 0);
  CHECK(standin_enqueue(s1, write_one, NULL, NULL) == cudaSuccess);
  CHECK(cudaEventRecord(e, s1) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(s2, e, 0) == cudaSuccess);
  CHECK(standin_enqueue(s2, read_value, &with_wait, NULL) == cudaSuccess);
  CHECK(standin_enqueue(s3, read_value, &without, NULL) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s3) == cudaSuccess);
  CHECK_EQ(without, 0);
  sleep_ms(10);
  CHECK(cudaStreamQuery(s2) == cudaErrorNotReady);
  atomic_store(&gate, 1);
  CHECK(cudaStreamSynchronize(s2) == cudaSuccess);
  CHECK_EQ(with_wait, 1);
  CHECK(cudaEventDestroy(e) == cudaSuccess);
  CHECK(cudaStreamDestroy(s1) == cudaSuccess && cudaStreamDestroy(s2) == cudaSuccess);
  CHECK(cudaStreamDestroy(s3) == cudaSuccess);
}

static cudaError_t fail_item(void *arg) {
  (void)arg;
  return cudaErrorIllegalAddress;
}

/* Stream-ordered errors are sticky (in a child: they poison the device). */
static void test_sticky_errors(void) {
  if (!getenv("ZB_STANDIN_STICKY_CHILD")) {
    char *argv[] = {"/proc/self/exe", "test_sticky_errors", NULL};
    char *envp[] = {"ZB_STANDIN_STICKY_CHILD=1", NULL};
    pid_t pid;
    int st;
    CHECK(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, envp) == 0);
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the sticky-error child failed (status %d)", st);
    return;
  }
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess);
  log_n = 0;
  atomic_store(&released, 0);
  /* closed gate first: the failing item must not run (and poison the
   * stream, which refuses further work) before the later item is queued */
  atomic_store(&gate, 0);
  CHECK(standin_enqueue(s, wait_gate, NULL, NULL) == cudaSuccess);
  CHECK(standin_enqueue(s, fail_item, NULL, NULL) == cudaSuccess);
  CHECK(standin_enqueue(s, log_item, NULL, count_release) == cudaSuccess);
  atomic_store(&gate, 1);
  CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress);
  CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress); /* sticky */
  CHECK_EQ(log_n, 0);                                         /* later work was skipped */
  CHECK_EQ(atomic_load(&released), 1);                        /* but released */
  CHECK(standin_enqueue(s, log_item, NULL, NULL) == cudaErrorIllegalAddress);
  CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
  CHECK(cudaPeekAtLastError() == cudaErrorIllegalAddress);
}

/* ---- memset and 2D copies ---- */

static void test_memset_and_2d(void) {
  unsigned char host[48], out[48];
  for (int i = 0; i < 48; i++)
    host[i] = (unsigned char)i;
  unsigned char *d = dalloc(48);
  CHECK(d);
  CHECK(cudaMemset(d, 0x5a, 48) == cudaSuccess);
  CHECK(cudaMemcpy2DAsync(d, 16, host, 12, 5, 3, cudaMemcpyHostToDevice, 0) == cudaSuccess);
  CHECK(cudaMemcpy(out, d, 48, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 16; c++)
      CHECK_EQ(out[r * 16 + c], c < 5 ? host[r * 12 + c] : 0x5a);
  float *f = dalloc(sizeof(float));
  float v;
  CHECK(cudaMemcpy(&v, f, sizeof v, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK_MSG(isnan(v), "fresh device memory reads %g; the stand-in fills it with NaN", v);
  CHECK(cudaFree(d) == cudaSuccess && cudaFree(f) == cudaSuccess);
}

/* ---- cuBLAS against a naive column-major loop ---- */

/* Rounds to `keep` mantissa bits by scaling (a different method from the
 * stand-in's bit arithmetic); nearbyint rounds to nearest even. */
static float ref_round(float x, int keep) {
  if (x == 0 || !isfinite(x))
    return x;
  int e;
  double m = frexp(x, &e);
  return (float)ldexp(nearbyint(ldexp(m, keep + 1)), e - keep - 1);
}

typedef struct shape {
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc, batch;
  long long sa, sb, sc;
  float alpha, beta;
} shape;

/* Checks C (as computed) against the loop in double over the inputs as
 * stored: C0 is C before the call. */
static int compare(const shape *s, const float *A, const float *B, const float *C0, const float *C,
                   int keep) {
  int bad = 0;
  for (int q = 0; q < s->batch; q++)
    for (int j = 0; j < s->n; j++)
      for (int i = 0; i < s->m; i++) {
        double acc = 0, mag = 0;
        for (int p = 0; p < s->k; p++) {
          const float *Aq = A + q * s->sa, *Bq = B + q * s->sb;
          float a = s->ta == CUBLAS_OP_N ? Aq[i + p * s->lda] : Aq[p + i * s->lda];
          float b = s->tb == CUBLAS_OP_N ? Bq[p + j * s->ldb] : Bq[j + p * s->ldb];
          if (keep < 23)
            a = ref_round(a, keep), b = ref_round(b, keep);
          acc += (double)a * b;
          mag += fabs((double)a * b);
        }
        size_t ci = (size_t)q * s->sc + i + (size_t)j * s->ldc;
        double c0 = s->beta == 0 ? 0 : s->beta * (double)C0[ci];
        double want = s->alpha * acc + c0, tol = 1e-5 * (fabs(s->alpha) * mag + fabs(c0) + 1e-30);
        bad += !(fabs(C[ci] - want) <= tol);
      }
  return bad;
}

/* Runs one shape through all three GEMM entry points. */
static int run_shape(cublasHandle_t h, const shape *s) {
  int arows = s->ta == CUBLAS_OP_N ? s->m : s->k, acols = s->ta == CUBLAS_OP_N ? s->k : s->m;
  int brows = s->tb == CUBLAS_OP_N ? s->k : s->n, bcols = s->tb == CUBLAS_OP_N ? s->n : s->k;
  size_t na = (size_t)(s->batch - 1) * s->sa + (size_t)(acols - 1) * s->lda + arows;
  size_t nb = (size_t)(s->batch - 1) * s->sb + (size_t)(bcols - 1) * s->ldb + brows;
  size_t nc = (size_t)(s->batch - 1) * s->sc + (size_t)(s->n - 1) * s->ldc + s->m;
  float *A = malloc(na * 4), *B = malloc(nb * 4), *C0 = malloc(nc * 4), *C = malloc(nc * 4);
  float *dA = dalloc(na * 4), *dB = dalloc(nb * 4), *dC = dalloc(nc * 4);
  unsigned seed = (unsigned)(s->m * 131 + s->n * 17 + s->k);
  for (size_t i = 0; i < na; i++)
    A[i] = (float)((seed = seed * 1103515245u + 12345u) >> 16 & 0xffff) / 32768.0f - 1.0f;
  for (size_t i = 0; i < nb; i++)
    B[i] = (float)((seed = seed * 1103515245u + 12345u) >> 16 & 0xffff) / 32768.0f - 1.0f;
  int bad = 0;
  for (int api = 0; api < 3; api++) {
    for (size_t i = 0; i < nc; i++) /* NaN in C: beta = 0 must not read it */
      C0[i] = s->beta == 0 ? NAN : (float)i * 0.25f - 1.0f;
    cudaMemcpy(dA, A, na * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B, nb * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dC, C0, nc * 4, cudaMemcpyHostToDevice);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (int q = 0; q < s->batch && api == 0; q++)
      st |= cublasSgemm(h, s->ta, s->tb, s->m, s->n, s->k, &s->alpha, dA + q * s->sa, s->lda, dB + q * s->sb,
                        s->ldb, &s->beta, dC + q * s->sc, s->ldc);
    if (api == 1)
      st = cublasSgemmStridedBatched(h, s->ta, s->tb, s->m, s->n, s->k, &s->alpha, dA, s->lda, s->sa, dB,
                                     s->ldb, s->sb, &s->beta, dC, s->ldc, s->sc, s->batch);
    if (api == 2)
      st = cublasGemmStridedBatchedEx(h, s->ta, s->tb, s->m, s->n, s->k, &s->alpha, dA, CUDA_R_32F, s->lda,
                                      s->sa, dB, CUDA_R_32F, s->ldb, s->sb, &s->beta, dC, CUDA_R_32F, s->ldc,
                                      s->sc, s->batch, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
    /* the handle's stream is non-blocking: cudaMemcpy does not wait for it */
    cudaStream_t hs;
    cublasGetStream(h, &hs);
    cudaStreamSynchronize(hs);
    cudaMemcpy(C, dC, nc * 4, cudaMemcpyDeviceToHost);
    bad += st != CUBLAS_STATUS_SUCCESS ? 1000000 : compare(s, A, B, C0, C, 23);
  }
  cudaFree(dA), cudaFree(dB), cudaFree(dC);
  free(A), free(B), free(C0), free(C);
  return bad;
}

static void test_cublas_vs_loop(void) {
  cublasHandle_t h;
  cudaStream_t st;
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cublasSetStream(h, st) == CUBLAS_STATUS_SUCCESS);
  static const int dims[][3] = {{1, 1, 1}, {3, 5, 7}, {7, 3, 5}, {5, 7, 1}, {16, 9, 33}, {2, 11, 4}};
  static const float ab[][2] = {{1, 0}, {0.5f, 2}, {-1.5f, 0.25f}, {0, 1}};
  int shapes = 0;
  for (int d = 0; d < 6; d++)
    for (int t = 0; t < 4; t++)
      for (int pad = 0; pad < 2; pad++)
        for (int batch = 1; batch <= 3; batch += 2) {
          shape s = {.ta = t & 1 ? CUBLAS_OP_T : CUBLAS_OP_N,
                     .tb = t & 2 ? CUBLAS_OP_T : CUBLAS_OP_N,
                     .m = dims[d][0],
                     .n = dims[d][1],
                     .k = dims[d][2],
                     .batch = batch,
                     .alpha = ab[(d + t) % 4][0],
                     .beta = ab[(d + t + pad) % 4][1]};
          s.lda = (s.ta == CUBLAS_OP_N ? s.m : s.k) + pad * 3;
          s.ldb = (s.tb == CUBLAS_OP_N ? s.k : s.n) + pad * 2;
          s.ldc = s.m + pad;
          s.sa = (long long)s.lda * (s.ta == CUBLAS_OP_N ? s.k : s.m) + pad * 5;
          s.sb = (long long)s.ldb * (s.tb == CUBLAS_OP_N ? s.n : s.k) + pad;
          s.sc = (long long)s.ldc * s.n + pad * 7;
          int bad = run_shape(h, &s);
          CHECK_MSG(bad == 0, "m %d n %d k %d ta %d tb %d lda %d batch %d alpha %g beta %g: %d wrong", s.m,
                    s.n, s.k, s.ta, s.tb, s.lda, s.batch, s.alpha, s.beta, bad);
          shapes++;
        }
  CHECK_EQ(shapes, 96);
  CHECK(cudaStreamSynchronize(st) == cudaSuccess);
  CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
  CHECK(cudaStreamDestroy(st) == cudaSuccess);
}

/* TF32 and bf16 round the inputs (round to nearest even) before the product. */
static void test_cublas_reduced_precision(void) {
  cublasHandle_t h;
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  enum { K = 9 };
  float a[K], b[K], c, one = 1, zero = 0;
  for (int i = 0; i < K; i++) {
    a[i] = 1.0f + (float)(i + 1) * 0x1p-12f + 0x1p-20f; /* bits below tf32's and bf16's mantissa */
    b[i] = 1.0f - (float)i * 0x1p-9f;
  }
  float *dA = dalloc(sizeof a), *dB = dalloc(sizeof b), *dC = dalloc(4);
  cudaMemcpy(dA, a, sizeof a, cudaMemcpyHostToDevice);
  cudaMemcpy(dB, b, sizeof b, cudaMemcpyHostToDevice);
  static const struct {
    cublasComputeType_t ct;
    int keep;
  } modes[] = {
      {CUBLAS_COMPUTE_32F, 23}, {CUBLAS_COMPUTE_32F_FAST_TF32, 10}, {CUBLAS_COMPUTE_32F_FAST_16BF, 7}};
  float got[3];
  for (int m = 0; m < 3; m++) {
    CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, K, &one, dA, CUDA_R_32F, K, 0, dB,
                                     CUDA_R_32F, K, 0, &zero, dC, CUDA_R_32F, 1, 0, 1, modes[m].ct,
                                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    cudaMemcpy(&c, dC, 4, cudaMemcpyDeviceToHost);
    float want = 0;
    for (int i = 0; i < K; i++)
      want += (modes[m].keep < 23 ? ref_round(a[i], modes[m].keep) * ref_round(b[i], modes[m].keep)
                                  : a[i] * b[i]);
    CHECK_NEAR(c, want, 1e-6 * K);
    got[m] = c;
  }
  CHECK(got[0] != got[1] && got[1] != got[2]); /* the rounding is visible */
  /* the fp32 call follows the handle's math mode */
  CHECK(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, K, &one, dA, K, dB, K, &zero, dC, 1) ==
        CUBLAS_STATUS_SUCCESS);
  cudaMemcpy(&c, dC, 4, cudaMemcpyDeviceToHost);
  CHECK_NEAR(c, got[1], 0);
  cublasMath_t mode;
  CHECK(cublasGetMathMode(h, &mode) == CUBLAS_STATUS_SUCCESS && mode == CUBLAS_TF32_TENSOR_OP_MATH);
  CHECK(cublasSetMathMode(h, (cublasMath_t)77) == CUBLAS_STATUS_INVALID_VALUE);
  cudaFree(dA), cudaFree(dB), cudaFree(dC);
  CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
}

/* cuBLAS's argument checks: a wrong leading dimension is refused. */
static void test_cublas_refusals(void) {
  cublasHandle_t h;
  float one = 1, zero = 0;
  float *d = dalloc(64 * 4);
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T;
  CHECK(cublasSgemm(h, N, N, 4, 3, 2, &one, d, 4, d, 2, &zero, d + 32, 4) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSgemm(h, N, N, 4, 3, 2, &one, d, 3, d, 2, &zero, d + 32, 4) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(has("lda below"));
  CHECK(cublasSgemm(h, T, N, 4, 3, 2, &one, d, 1, d, 2, &zero, d + 32, 4) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemm(h, T, N, 4, 3, 2, &one, d, 2, d, 2, &zero, d + 32, 4) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSgemm(h, N, T, 4, 3, 2, &one, d, 4, d, 2, &zero, d + 32, 4) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(has("ldb below"));
  CHECK(cublasSgemm(h, N, N, 4, 3, 2, &one, d, 4, d, 2, &zero, d + 32, 3) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemm(h, N, N, -1, 3, 2, &one, d, 4, d, 2, &zero, d + 32, 4) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemm(h, (cublasOperation_t)9, N, 4, 3, 2, &one, d, 4, d, 2, &zero, d, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemm(h, N, N, 4, 3, 2, NULL, d, 4, d, 2, &zero, d, 4) == CUBLAS_STATUS_INVALID_VALUE);
  /* a batch whose last matrix runs past the allocation */
  CHECK(cublasSgemmStridedBatched(h, N, N, 4, 3, 2, &one, d, 4, 8, d, 2, 6, &zero, d + 32, 4, 12, 3) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(has("cublasSgemmStridedBatched C") && has("out of bounds"));
  CHECK(cublasGemmStridedBatchedEx(h, N, N, 4, 3, 2, &one, d, CUDA_R_16F, 4, 8, d, CUDA_R_32F, 2, 6, &zero,
                                   d + 32, CUDA_R_32F, 4, 12, 1, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(cublasGemmStridedBatchedEx(h, N, N, 4, 3, 2, &one, d, CUDA_R_32F, 4, 8, d, CUDA_R_32F, 2, 6, &zero,
                                   d + 32, CUDA_R_32F, 4, 12, 1, CUBLAS_COMPUTE_16F,
                                   CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
  cudaStream_t s = (cudaStream_t)0;
  CHECK(cublasGetStream(h, &s) == CUBLAS_STATUS_SUCCESS && s == NULL);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSgemm(h, N, N, 4, 3, 2, &one, d, 4, d, 2, &zero, d, 4) == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(cudaFree(d) == cudaSuccess);
}

/* cudaMemGetInfo follows the device bytes the stand-in tracks: free drops
 * by exactly what cudaMalloc took and comes back at the free. */
static void test_mem_get_info(void) {
  size_t free0 = 0, total = 0, free1 = 0, free2 = 0;
  CHECK(cudaMemGetInfo(&free0, &total) == cudaSuccess);
  CHECK_EQ(total, (size_t)16 << 30);
  CHECK(free0 <= total);
  void *p = dalloc(12345);
  CHECK(cudaMemGetInfo(&free1, &total) == cudaSuccess);
  CHECK_EQ(free0 - free1, (size_t)12345);
  CHECK(cudaFree(p) == cudaSuccess);
  CHECK(cudaMemGetInfo(&free2, &total) == cudaSuccess);
  CHECK_EQ(free2, free0);
  CHECK(cudaMemGetInfo(NULL, &total) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
}

/* cublasSetWorkspace takes device memory of at least the bytes given, and
 * a GEMM names a workspace freed under the handle. */
static void test_cublas_workspace(void) {
  cublasHandle_t h;
  float one = 1, zero = 0, host[4];
  float *d = dalloc(64 * 4);
  char *ws = dalloc(4096);
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSetWorkspace(h, host, sizeof host) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(has("cublasSetWorkspace") && has("host memory"));
  CHECK(cublasSetWorkspace(h, ws, 4097) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(has("out of bounds"));
  CHECK(cublasSetWorkspace(h, NULL, 16) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSetWorkspace(NULL, ws, 4096) == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(cublasSetWorkspace(h, ws, 4096) == CUBLAS_STATUS_SUCCESS);
  cublasOperation_t N = CUBLAS_OP_N;
  CHECK(cublasSgemm(h, N, N, 4, 3, 2, &one, d, 4, d, 2, &zero, d + 32, 4) == CUBLAS_STATUS_SUCCESS);
  CHECK(cudaFree(ws) == cudaSuccess);
  CHECK(cublasSgemm(h, N, N, 4, 3, 2, &one, d, 4, d, 2, &zero, d + 32, 4) == CUBLAS_STATUS_EXECUTION_FAILED);
  CHECK(has("workspace") && has("freed"));
  CHECK(cublasSetWorkspace(h, NULL, 0) == CUBLAS_STATUS_SUCCESS); /* back to cuBLAS's own */
  CHECK(cublasSgemm(h, N, N, 4, 3, 2, &one, d, 4, d, 2, &zero, d + 32, 4) == CUBLAS_STATUS_SUCCESS);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
  CHECK(cudaFree(d) == cudaSuccess);
}

ZBT_MAIN(ZBT(test_device_info), ZBT(test_host_device_mixup), ZBT(test_wrong_copy_kind),
         ZBT(test_out_of_bounds), ZBT(test_use_after_free), ZBT(test_free_async), ZBT(test_read_without_sync),
         ZBT(test_pageable_copies), ZBT(test_streams), ZBT(test_events), ZBT(test_stream_wait_event),
         ZBT(test_sticky_errors), ZBT(test_memset_and_2d), ZBT(test_cublas_vs_loop),
         ZBT(test_cublas_reduced_precision), ZBT(test_cublas_refusals), ZBT(test_mem_get_info),
         ZBT(test_cublas_workspace))
