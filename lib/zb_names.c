/* zb_names.c — the backend and device names (zb_names.h). */
#include "zb_names.h"

#include <string.h>

const char *const zb_backend_names[4] = {ZB_BACKEND_SIM, ZB_BACKEND_CPU, ZB_BACKEND_CUDA, ZB_BACKEND_TORCH};

bool zb_backend_runs_model(const char *backend) {
  return strcmp(backend, ZB_BACKEND_CPU) == 0 || strcmp(backend, ZB_BACKEND_CUDA) == 0;
}

bool zb_backend_needs_gpu(const char *backend) {
  return strcmp(backend, ZB_BACKEND_CUDA) == 0;
}
