/* zb_names.h — the names of compute backends and devices, in one place
 * (docs/model.md, Backends): what a job spec's `backend` says, what a
 * worker advertises, what a backend's and a device's vtables call
 * themselves. Adding a backend or a device starts here. */
#ifndef ZB_NAMES_H
#define ZB_NAMES_H

#include <stdbool.h>

/* Backends: how a worker executes ops. */
#define ZB_BACKEND_SIM "sim"   /* sleeps the configured op times */
#define ZB_BACKEND_CPU "cpu"   /* the model on the host device */
#define ZB_BACKEND_CUDA "cuda" /* the model on a CUDA device */
/* A torchrun job (docs/pytorch.md, Attaching a torchrun job): the
 * script owns the model and its process group moves the tensors
 * (transport torch); only zb.torch.attach agents offer it. */
#define ZB_BACKEND_TORCH "torch"
#define ZB_TRANSPORT_TORCH "torch"

/* Devices: where the model's buffers and ops live (model/zb_device.h). */
#define ZB_DEVICE_HOST "host"
#define ZB_DEVICE_CUDA "cuda"

/* Every backend name, in the order specs and workers list them. */
extern const char *const zb_backend_names[4];

/* The backend runs the model (cpu, cuda): it has weights, data and a
 * step; false for sim and for a name that is no backend. */
bool zb_backend_runs_model(const char *backend);
/* The backend needs a GPU (cuda). */
bool zb_backend_needs_gpu(const char *backend);

#endif
