/* zb_validate_internal.h — the two halves of the validator (zb_validate.h)
 * and what they share: the scan over every action (zb_validate.c), which
 * also runs the whole check, and the deadlock run (zb_validate_deadlock.c).
 * Not part of libzb's interface.
 */
#ifndef ZB_VALIDATE_INTERNAL_H
#define ZB_VALIDATE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "zb_validate.h"

enum { VKINDS = ZB_VIOL_MEMORY + 1 };

typedef struct vctx {
  const zb_schedule *s;
  const zb_costs *c;
  int S, m;
  bool lowered;
  int *stage_rank;
  /* per (stage, mb): what the scan has seen, as CELL_* bits in one
   * word, so that a rank's pass walks one row per stage, not twelve */
  uint16_t *cell;
  zb_violation first[VKINDS]; /* the first of each kind, in scan order */
  /* the gradient reduction (zb_validate_reduce.c): per stage the index
   * of its REDUCE_GRAD on its rank (-1: none yet); whether the lists
   * hold any reduction action; on the rank being scanned, its last
   * REDUCE_GRAD's index and stage (-1: none) and its last wait's index */
  int *reduce_at;
  bool any_reduce;
  int last_reduce, last_reduce_stage, last_wait;
} vctx;

/* The scan's part for the reduction (docs/schedules.md, Gradient
 * reduction), each noting its first violation of a kind: a REDUCE_GRAD
 * or WAIT_REDUCE_GRAD at rank r's index i; a W or BW (after its stage's
 * REDUCE_GRAD?); the start and the end of rank r's list. */
void zb_validate_reduce_action(vctx *x, int r, int i, const zb_action *a);
void zb_validate_reduce_weight(vctx *x, int r, int i, const zb_action *a);
void zb_validate_reduce_rank_begin(vctx *x);
void zb_validate_reduce_rank_end(vctx *x, int r);
/* After the scan: when the lists reduce at all, every stage's
 * REDUCE_GRAD there (ZB_VIOL_MISSING into out). */
zb_err zb_validate_reduce_missing(const vctx *x, zb_violation *out);

/* Fills out with a violation of kind k at action a, index `index` of
 * rank's list (-1: none), its detail from fmt; returns
 * ZB_ERR_INVALID_SCHEDULE. */
zb_err zb_validate_violation(zb_violation *out, zb_violation_kind k, int rank, int index, const zb_action *a,
                             const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* The deadlock run over x's lists. done: zeroed scratch of 2*S*m cells
 * for compute-only lists (done_f, then done_b), NULL for lowered ones.
 * guarded: the run goes before the scan has vouched for the lists and
 * checks each index; *gave_up then says that it stopped on an action out
 * of range, and its verdict means nothing. A deadlock, or (lowered) two
 * messages that pair up but are not one transfer, into out. */
zb_err zb_validate_deadlock(const vctx *x, unsigned char *done, bool guarded, bool *gave_up,
                            zb_violation *out);

#endif
