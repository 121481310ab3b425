/* zb_step_chain.h — the worker's zb_step_reduce_fn (train/zb_step.h): the
 * optimizer step's global check (gradient norm, finiteness) reduced over
 * the p2p transport, so every rank takes the same branch.
 *
 * Ownership: the chain borrows the transport, which must outlive the call.
 * Blocks on the transport's sends and receives.
 *
 * Results: zb_err from lib/zb_err.h; the transport's errors pass through.
 */
#ifndef ZB_STEP_CHAIN_H
#define ZB_STEP_CHAIN_H

#include <stdint.h>

#include "zb_step.h"
#include "zb_transport.h"

/* The worker's reduction over the transport: a chain up the ranks
 * 0 -> 1 -> ... -> p-1 accumulating ((s0 + s1) + s2) + ..., then the total
 * back down p-1 -> ... -> 0, so every rank holds the same bits. Ranks r and
 * r+1 must be connected. Tags use stage -1, which no activation or
 * gradient carries: (F, -1, iteration) up, (B, -1, iteration) down. */
typedef struct zb_step_chain {
  zb_transport *tr;
  int rank, nranks; /* the pipeline rank and the plan's p: the chain runs within one replica */
  int32_t iteration;
  int peer_base; /* transport rank of the replica's pipeline rank 0 (replica x p); 0 with one replica */
} zb_step_chain;

zb_err zb_step_reduce_chain(void *chain, zb_step_partial *p, zb_diag *diag);

#endif
