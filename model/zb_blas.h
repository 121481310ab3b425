/* zb_blas.h — the CBLAS the model was built against (docs/model.md, BLAS):
 * OpenBLAS, BLIS or MKL, chosen at configure time with -DZB_BLAS
 * (cmake/ZbBlas.cmake defines ZB_BLAS_OPENBLAS, ZB_BLAS_BLIS or
 * ZB_BLAS_MKL). Including it gives the cblas_* declarations of that
 * library (MKL names its header mkl_cblas.h), its name and version as the
 * library reports them, and its thread count.
 */
#ifndef ZB_BLAS_H
#define ZB_BLAS_H

#include <stddef.h>

#if defined(ZB_BLAS_MKL)
#include <mkl_cblas.h>
#else
#include <cblas.h>
#endif

/* "openblas", "blis" or "mkl": the library linked in. */
const char *zb_blas_name(void);

/* The library, its version and, where it says, the kernels it picked for
 * this processor, as the library reports them at run time, in one line
 * without a newline: "openblas 0.3.21 Zen", "blis 0.9.0 zen3",
 * "mkl 2025.2" (MKL names its branch only on some processors: "mkl 2025.2
 * AVX512"). Writes at most cap bytes (cap > 0), NUL included;
 * returns out. zb-worker --version prints it and the worker advertises it
 * on attach (docs/operations.md). */
char *zb_blas_describe(char *out, size_t cap);

/* Threads the library's products may use (n < 1 means 1). */
void zb_blas_set_threads(int n);

#endif
