/* blas.c — the name, version and thread count of the CBLAS linked in
 * (zb_blas.h; docs/model.md, BLAS). One branch per library, picked by the
 * ZB_BLAS_* definition cmake/ZbBlas.cmake sets; each asks its library,
 * so a processor-dependent kernel choice (OpenBLAS's and BLIS's dynamic
 * architectures, MKL's code branch) shows as picked on this machine. */
#include <stdio.h>
#include <string.h>

#include "zb_blas.h"

#if defined(ZB_BLAS_MKL)
#include <mkl_service.h>
#elif defined(ZB_BLAS_BLIS)
#include <blis.h>
#else
/* OpenBLAS's own; declared here too because a cblas.h found by the
 * non-pkg-config path may lack them. */
char *openblas_get_config(void);
char *openblas_get_corename(void);
void openblas_set_num_threads(int num_threads);
#endif

#if defined(ZB_BLAS_MKL)
/* The code branch MKL dispatches to on this processor (its CNR names),
 * " AVX2" say; "" where it does not name one (MKL_CBWR_AUTO, as on AMD
 * processors, or a branch this list lacks). */
static const char *mkl_branch_name(int b) {
  switch (b) {
  case MKL_CBWR_COMPATIBLE: return " compatible";
  case MKL_CBWR_SSE2: return " SSE2";
  case MKL_CBWR_SSSE3: return " SSSE3";
  case MKL_CBWR_SSE4_1: return " SSE4_1";
  case MKL_CBWR_SSE4_2: return " SSE4_2";
  case MKL_CBWR_AVX: return " AVX";
  case MKL_CBWR_AVX2: return " AVX2";
  case MKL_CBWR_AVX512: return " AVX512";
  case MKL_CBWR_AVX512_E1: return " AVX512_E1";
  case MKL_CBWR_AVX10: return " AVX10";
  default: return "";
  }
}
#endif

const char *zb_blas_name(void) {
#if defined(ZB_BLAS_MKL)
  return "mkl";
#elif defined(ZB_BLAS_BLIS)
  return "blis";
#else
  return "openblas";
#endif
}

char *zb_blas_describe(char *out, size_t cap) {
#if defined(ZB_BLAS_MKL)
  MKLVersion v;
  mkl_get_version(&v);
  /* MKL's own version name is major.update ("Version 2025.2" in
   * mkl_get_version_string), with the patch level after a third dot. */
  char patch[16] = "";
  if (v.PatchVersion > 0)
    snprintf(patch, sizeof patch, ".%d", v.PatchVersion);
  snprintf(out, cap, "mkl %d.%d%s%s", v.MajorVersion, v.UpdateVersion, patch,
           mkl_branch_name(mkl_cbwr_get_auto_branch()));
#elif defined(ZB_BLAS_BLIS)
  snprintf(out, cap, "blis %s %s", bli_info_get_version_str(), bli_arch_string(bli_arch_query_id()));
#else
  /* openblas_get_config(): "OpenBLAS 0.3.21 DYNAMIC_ARCH ... Zen ..." */
  char version[32] = "?";
  const char *cfg = openblas_get_config();
  if (cfg && strncmp(cfg, "OpenBLAS ", 9) == 0)
    sscanf(cfg + 9, "%31s", version);
  snprintf(out, cap, "openblas %s %s", version, openblas_get_corename());
#endif
  return out;
}

void zb_blas_set_threads(int n) {
  if (n < 1)
    n = 1;
#if defined(ZB_BLAS_MKL)
  mkl_set_num_threads(n);
#elif defined(ZB_BLAS_BLIS)
  bli_thread_set_num_threads(n);
#else
  openblas_set_num_threads(n);
#endif
}
