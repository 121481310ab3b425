/* zb_step_device.h — the optimizer step on the device (docs/model.md,
 * Optimizer and step): a step target (zb_step.h) that keeps each hosted
 * stage's AdamW moments in device memory and steps the stage's device
 * parameters from its device gradients with the device's adamw op, so a
 * cuda job copies no parameters or gradients through the host per
 * iteration. Only the partial of the global check comes back: one double
 * and one int per stage, read after one sync.
 *
 * Same arithmetic as the host target: the per-step coefficients come from
 * zb_adamw_coefs with the stage's zb_adamw config and step count, and the
 * device's adamw op is zbm_adamw per element (model/zb_kernel_math.h), the
 * host zb_adamw's formula; every stage in one launch (adamw_multi). The
 * partial is the device's sum of squares per stage (sumsq_multi: one
 * launch for all stages, many blocks, zb_kernel_math.h's blocked order, in
 * double), added stage by stage on the host in double, so the norm agrees
 * with the host target's to double rounding. The device needs both fused
 * ops (ZB_ERR_UNSUPPORTED otherwise; the host and CUDA devices have them).
 * Rollback (post-validated) keeps one copy per stage, the parameters: the
 * tried step (adamw_multi's TRY) writes the new parameters and keeps the
 * old ones, and leaves m and v alone; commit (the check passed) writes the
 * moments from the same inputs (COMMIT), restore copies the parameters
 * back. Every bit, as a full step and as no step.
 *
 * The host zb_adamw per stage (borrowed) gives the config and decay mask
 * (uploaded once) and is the host staging of the state a checkpoint needs:
 * zb_step_device_pull_state copies the device moments and the step count
 * into it, zb_step_device_push_state sends its state to the device (a
 * resume). Between those calls its moments are stale.
 *
 * Ownership: zb_step_device_new gives the caller the target, freed with
 * zb_step_device_free (NULL is a no-op; gives its device buffers back).
 * It borrows the device, the optimizers and the stages' device arrays,
 * which must outlive it. One thread at a time (the device's).
 *
 * Results: zb_err from lib/zb_err.h; a device failure is the device's
 * error (ZB_ERR_IO) with its message, and poisons the device.
 */
#ifndef ZB_STEP_DEVICE_H
#define ZB_STEP_DEVICE_H

#include <stdbool.h>

#include "zb_device.h"
#include "zb_optimizer.h"
#include "zb_step.h"

typedef struct zb_step_device zb_step_device;

/* A device target for n stages: stage i's params[i] and grads[i] are
 * device arrays of zb_adamw_size(opt[i]) floats on dev. The moments and
 * step counts start as opt[i]'s (zero for a new one). With rollback it
 * also allocates the backup a post-validated step needs (the parameters:
 * one array per stage, zb_step_device_rollback_bytes). ZB_ERR_INVALID_ARG for n < 0 or missing arrays. */
zb_err zb_step_device_new(zb_device *dev, int n, zb_adamw *const *opt, float *const *params,
                          const float *const *grads, bool rollback, zb_step_device **out, zb_diag *diag);
void zb_step_device_free(zb_step_device *t);

/* The check counts only stage i's first n gradients, as
 * zb_stepper_count_prefix (zb_step.h) for the host target. */
zb_err zb_step_device_count_prefix(zb_step_device *t, int i, size_t n, zb_diag *diag);

/* Device bytes held for rollback: 4 per parameter with rollback, else 0. */
size_t zb_step_device_rollback_bytes(const zb_step_device *t);

/* The target to give zb_stepper_new_target (self is t, borrowed). */
zb_step_target zb_step_device_target(zb_step_device *t);

/* Device moments and step counts -> opt[i] (zb_adamw_set_state), waiting
 * for the copies: what a checkpoint saves. */
zb_err zb_step_device_pull_state(zb_step_device *t, zb_diag *diag);

/* opt[i]'s moments and step counts -> the device: a resume. */
zb_err zb_step_device_push_state(zb_step_device *t, zb_diag *diag);

#endif
