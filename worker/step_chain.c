/* step_chain.c — the worker's reduction of the optimizer step's global
 * check over the transport (zb_step_chain.h). */
#include "zb_step_chain.h"

zb_err zb_step_reduce_chain(void *arg, zb_step_partial *p, zb_diag *diag) {
  const zb_step_chain *c = arg;
  if (c->nranks <= 1)
    return ZB_OK;
  /* two doubles: the sum and 1/0 for finite, one fixed layout on every rank */
  double msg[2];
  zb_tag up = {.kind = ZB_OP_F, .stage = -1, .mb = c->iteration};
  zb_tag down = {.kind = ZB_OP_B, .stage = -1, .mb = c->iteration};
  zb_err err;
  if (c->rank > 0) {
    if ((err = zb_transport_recv(c->tr, c->peer_base + c->rank - 1, up, msg, sizeof msg, diag)))
      return err;
    /* lower ranks' sum first, then ours: ((s0 + s1) + s2) + ... */
    p->sumsq = msg[0] + p->sumsq;
    p->finite = p->finite && msg[1] != 0;
  }
  if (c->rank < c->nranks - 1) {
    msg[0] = p->sumsq;
    msg[1] = p->finite ? 1 : 0;
    if ((err = zb_transport_send(c->tr, c->peer_base + c->rank + 1, up, msg, sizeof msg, diag)) ||
        (err = zb_transport_recv(c->tr, c->peer_base + c->rank + 1, down, msg, sizeof msg, diag)))
      return err;
    p->sumsq = msg[0];
    p->finite = msg[1] != 0;
  }
  if (c->rank > 0) {
    msg[0] = p->sumsq;
    msg[1] = p->finite ? 1 : 0;
    if ((err = zb_transport_send(c->tr, c->peer_base + c->rank - 1, down, msg, sizeof msg, diag)))
      return err;
  }
  return ZB_OK;
}
