/* fuzz_tcp_frame.c — the headers of the worker's tcp data plane
 * (worker/transport_tcp.h, zbtcp_frame_parse): the first bytes anyone who
 * reaches a worker's data port can send, a hello or a proof before the
 * handshake and a message header after it. Any bytes of any length must
 * decode or fail with a message. A header that decodes is exactly what
 * the sender's encoding of that frame gives (nothing in it is ignored),
 * so the same fields encode back to the same bytes.
 */
#include <string.h>

#include "fuzz.h"
#include "transport_tcp.h"

static void encode(const zbtcp_frame *f, unsigned char *b) {
  put_u32(b, f->magic);
  if (f->magic == TCP_MSG_MAGIC) {
    put_u32(b + 4, zbtcp_kind_byte(f->tag.kind));
    put_u32(b + 8, (uint32_t)f->tag.stage);
    put_u32(b + 12, (uint32_t)f->tag.mb);
    put_u64(b + 16, f->len);
    memcpy(b + TCP_FIELDS, f->mac, TCP_TAG); /* the header tag: carried, checked only with the key */
    return;
  }
  put_u32(b + 4, TCP_VERSION);
  put_u32(b + 8, (uint32_t)f->rank);
  put_u32(b + 12, (uint32_t)f->nranks);
  put_u64(b + 16, f->session);
  memcpy(b + 24, f->nonce, TCP_NONCE);
  memcpy(b + 24 + TCP_NONCE, f->mac, TCP_MAC);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  zbtcp_frame f;
  zb_diag d = {{0}};
  zb_err err = zbtcp_frame_parse(data, size, &f, &d);
  FUZZ_CHECK(size < 4 || f.magic == get_u32(data), "magic not reported");
  if (err != ZB_OK) {
    FUZZ_CHECK(err == ZB_ERR_PARSE && d.msg[0], "error %d (%s)", (int)err, d.msg);
    return 0;
  }
  bool message = f.magic == TCP_MSG_MAGIC;
  FUZZ_CHECK(size == (message ? TCP_FRAME : TCP_HELLO_FRAME), "a %zu-byte header decoded", size);
  if (message) {
    FUZZ_CHECK(zbtcp_kind_byte(f.tag.kind) != 0, "message kind %d", (int)f.tag.kind);
    FUZZ_CHECK(f.mac == data + TCP_FIELDS, "header tag outside the header");
  } else {
    FUZZ_CHECK(f.rank >= 0 && f.rank < f.nranks, "rank %d of %d", f.rank, f.nranks);
    FUZZ_CHECK(f.nonce == data + 24 && f.mac == data + 24 + TCP_NONCE, "nonce or MAC outside the header");
  }
  unsigned char again[TCP_HELLO_FRAME];
  encode(&f, again);
  FUZZ_CHECK(memcmp(again, data, size) == 0, "the decoded fields encode to other bytes");
  return 0;
}
