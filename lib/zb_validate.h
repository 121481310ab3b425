/* zb_validate.h — schedule validation. The first violation is returned as
 * data (kind, rank, index, action) so tests and tools can point at it.
 */
#ifndef ZB_VALIDATE_H
#define ZB_VALIDATE_H

#include "zb_par.h"
#include "zb_schedule.h"

typedef enum zb_violation_kind {
  ZB_VIOL_NONE = 0,
  ZB_VIOL_BAD_ACTION,    /* stage, microbatch or peer out of range */
  ZB_VIOL_PLACEMENT,     /* action on a rank that does not host its stage */
  ZB_VIOL_DUPLICATE,     /* a compute op appears twice (index: 2nd one) */
  ZB_VIOL_MISSING,       /* a compute op never appears (index: -1) */
  ZB_VIOL_DEPENDENCY,    /* an op runs before a same-rank input, or a
                            consumer has no RECV of its remote input */
  ZB_VIOL_COMM_MISMATCH, /* a SEND/RECV has no partner, or a wrong peer */
  ZB_VIOL_DEADLOCK,      /* lists cannot complete (index: first stuck op) */
  ZB_VIOL_MEMORY,        /* memory limit exceeded at this op */
} zb_violation_kind;

typedef struct zb_violation {
  zb_violation_kind kind;
  int rank;         /* -1 when not tied to a rank */
  int index;        /* position in the rank's list, -1 when none */
  zb_action action; /* the offending (or missing) action */
  char detail[160];
} zb_violation;

/* Name of a violation kind ("deadlock", ...). */
const char *zb_violation_kind_name(zb_violation_kind k);

/* Validates s: every action in range and on its stage's rank; every F, B,
 * W (or BW in place of B and W) of every stage and microbatch exactly
 * once; same-rank dependencies in order; when s has comm actions, every
 * remote input received before use and every send/recv matched with the
 * right peer, the sides paired in posting order per sender and receiver
 * as the transports pair them, and the lists free of deadlock under
 * blocking point-to-point with batched groups; without comm actions, free of deadlock under
 * infinite buffering; and, when c is given with a positive mem_limit, no
 * rank above it. Returns ZB_OK with out->kind == ZB_VIOL_NONE, or
 * ZB_ERR_INVALID_SCHEDULE with the first violation in *out, or
 * ZB_ERR_INVALID_ARG (kind NONE, reason in out->detail) when c does not
 * describe s's p*v stages. */
zb_err zb_validate(const zb_schedule *s, const zb_costs *c, zb_violation *out);

/* zb_validate with the deadlock run beside the other checks, on the two
 * pieces of par's runner (zb_par.h): the same verdict. The run then
 * starts on lists nothing has vouched for yet, and checks every index it
 * takes from them; it counts only when the other checks pass. */
zb_err zb_validate_par(const zb_schedule *s, const zb_costs *c, const zb_par *par, zb_violation *out);

/* One line describing v: "deadlock at rank 1 index 4 (1F3): ..." into buf. */
void zb_violation_format(const zb_violation *v, char *buf, int len);

#endif
