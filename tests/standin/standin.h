/* standin.h — internals shared by the parts of the CPU stand-in of the
 * CUDA runtime, cuBLAS and NCCL (test-only; docs/model.md, The CPU
 * stand-in). The stand-in implements, on the CPU, exactly the subset of
 * those C APIs that the cuda device (model/device_cuda.c) and the nccl
 * transport (worker/transport_nccl.c) call, so those files run unchanged
 * in CI. It is linked only into test binaries, never into a product.
 *
 * Parts: cudart_standin.c (device memory, streams, events), cublas_standin.c
 * (GEMMs in cuBLAS's column-major semantics), kernels_standin.c (the
 * zbk_* launchers of model/zb_cuda_kernels.h as host loops over
 * model/zb_kernel_math.h), nccl_standin.c (communicators and p2p between
 * processes over sockets).
 *
 * Streams: each cudaStream_t is a thread that runs its queue in order; the
 * legacy default stream (0) is one more. Work enqueued here runs there
 * asynchronously; ZB_STANDIN_DELAY_US (environment; also
 * standin_set_delay_us) delays every item, so a missing synchronisation
 * reads stale data in a test instead of passing by luck.
 */
#ifndef ZB_STANDIN_H
#define ZB_STANDIN_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>

/* One item of a stream's work, run on the stream's thread. A result other
 * than cudaSuccess is sticky: the stream is poisoned and the next
 * synchronisation (cudaStreamSynchronize, cudaDeviceSynchronize,
 * cudaStreamQuery, cudaEventSynchronize) returns it. */
typedef cudaError_t (*standin_fn)(void *arg);

/* Appends fn(arg) to stream s (0: the default stream); release(arg), when
 * not NULL, runs after fn on the stream's thread (also when fn is skipped
 * because the stream was poisoned). Returns at once:
 * cudaErrorInvalidResourceHandle for a stream that does not exist, the
 * stream's sticky error once it is poisoned. On an error nothing was
 * enqueued and the caller still owns arg (release is not called). fn may
 * block as long as it needs: the stream runs nothing else meanwhile and
 * cudaStreamQuery answers cudaErrorNotReady; other streams go on. */
cudaError_t standin_enqueue(cudaStream_t s, standin_fn fn, void *arg, void (*release)(void *arg));

/* cudaSuccess when [p, p + bytes) lies inside one live device allocation;
 * otherwise cudaErrorInvalidValue with a message naming `what`, the
 * pointer and whether it is host memory, freed device memory or out of
 * bounds (standin_last_error). bytes 0 checks p alone. */
cudaError_t standin_check_device(const void *p, size_t bytes, const char *what);

/* Device memory the host cannot read. cudaMalloc maps each allocation
 * twice: the pointer it returns is mapped without access (PROT_NONE), so a
 * host dereference of a device pointer dies of SIGSEGV as on a GPU; the
 * stand-in reaches the same bytes only through its own read-write view.
 * standin_view checks [p, p + bytes) as standin_check_device does and
 * returns the view of p (NULL, with the error recorded, when the check
 * fails); pinned host memory (cudaMallocHost) is plain host memory.
 *
 * The rule for the stand-in's parts: translate every device pointer once,
 * after checking it, where the work is put on a stream: kernels in
 * kernels_standin.c's launch() (every pointer field of its kjob: a new
 * field must be added to launch_views()), GEMMs in cublas_standin.c's
 * gemm_submit, copies in cudart_memory.c, NCCL buffers where ncclSend and
 * ncclRecv record them; the code that runs on the stream thread then only
 * sees views. A pointer kept for a later range check (the embedding's
 * table) keeps the room left in its allocation (standin_room) instead. */
void *standin_view(const void *p, size_t bytes, const char *what);

/* Bytes from p to the end of its live device allocation; 0 when p is not
 * in one. */
size_t standin_room(const void *p);

/* True when p points into a live device allocation. */
bool standin_is_device(const void *p);

/* Records the message of the last error the stand-in found (printed to
 * stderr with the prefix "cuda stand-in: " as well), and reads it. */
void standin_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *standin_last_error(void);

/* The per-item delay of every stream, in microseconds (0: none). */
void standin_set_delay_us(unsigned us);

/* The NCCL stand-in's link delay: every group of calls, once matched,
 * takes this long more on the comm stream (ZB_STANDIN_NCCL_DELAY_US;
 * nccl_standin_p2p.c). Microseconds, 0: none. */
void standin_set_nccl_delay_us(unsigned us);

/* True: this process runs on the stand-in (for tests and logs). */
bool standin_is_active(void);

/* Error injection (standin_fail.c has the knobs ZB_STANDIN_FAIL,
 * ZB_STANDIN_FAIL_SITE and ZB_STANDIN_SITES). standin_fail_set replaces
 * ZB_STANDIN_FAIL's rules ("api:N,..."; NULL or "" for none) and forgets
 * what fired; standin_fail_fired names the api whose injected failure
 * fired, NULL when none did. */
void standin_fail_set(const char *spec);
const char *standin_fail_fired(void);

/* The name the stand-in's device reports (cudaGetDeviceProperties). */
#define STANDIN_DEVICE_NAME "zb CPU stand-in (not a GPU)"

#endif
