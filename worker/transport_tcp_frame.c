/* transport_tcp_frame.c — decoding the frame headers the tcp transport
 * reads from its peers (transport_tcp.h, Wire format). Apart from the
 * socket code so that every byte a peer, or a stranger, can send is
 * checked by one pure function, which fuzz/fuzz_tcp_frame.c drives. */
#include <stdio.h>
#include <string.h>

#include "transport_tcp.h"

static zb_err parse_message(const unsigned char *h, zbtcp_frame *out, zb_diag *diag) {
  uint32_t kind = get_u32(h + 4);
  if (kind != 'F' && kind != 'B' && kind != 'R')
    return zb_diag_set(diag, ZB_ERR_PARSE, "message kind 0x%08x is not 'F', 'B' or 'R'", kind);
  out->tag = (zb_tag){.kind = kind == 'B'   ? ZB_OP_B
                              : kind == 'R' ? ZB_OP_REDUCE_GRAD
                                            : ZB_OP_F,
                      .stage = (int32_t)get_u32(h + 8),
                      .mb = (int32_t)get_u32(h + 12)};
  out->len = get_u64(h + 16);
  out->mac = h + TCP_FIELDS; /* the header tag */
  return ZB_OK;
}

static zb_err parse_handshake(const unsigned char *h, zbtcp_frame *out, zb_diag *diag) {
  uint32_t version = get_u32(h + 4), rank = get_u32(h + 8), nranks = get_u32(h + 12);
  if (version != TCP_VERSION)
    return zb_diag_set(diag, ZB_ERR_PARSE, "handshake version %u, this worker speaks %u", version,
                       TCP_VERSION);
  if (nranks < 1 || nranks > INT32_MAX || rank >= nranks)
    return zb_diag_set(diag, ZB_ERR_PARSE, "handshake from rank %u of %u ranks", rank, nranks);
  out->rank = (int)rank;
  out->nranks = (int)nranks;
  out->session = get_u64(h + 16);
  out->nonce = h + 24;
  out->mac = h + 24 + TCP_NONCE;
  return ZB_OK;
}

zb_err zbtcp_frame_parse(const unsigned char *hdr, size_t n, zbtcp_frame *out, zb_diag *diag) {
  memset(out, 0, sizeof *out);
  out->magic = n >= 4 ? get_u32(hdr) : 0;
  bool message = out->magic == TCP_MSG_MAGIC;
  if (!message && out->magic != TCP_HELLO_MAGIC && out->magic != TCP_PROOF_MAGIC)
    return zb_diag_set(diag, ZB_ERR_PARSE, "magic 0x%08x is not a zb frame's", out->magic);
  size_t want = message ? TCP_FRAME : TCP_HELLO_FRAME;
  if (n != want)
    return zb_diag_set(diag, ZB_ERR_PARSE, "a %s header is %zu bytes, not %zu",
                       message ? "message" : "handshake", want, n);
  return message ? parse_message(hdr, out, diag) : parse_handshake(hdr, out, diag);
}
