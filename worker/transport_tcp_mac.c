/* transport_tcp_mac.c — the tcp transport's per-frame MACs (transport_tcp.h,
 * Frame MACs): one HMAC-SHA256 context of OpenSSL's EVP_MAC per direction
 * of a connection, keyed once at the handshake. Each tag re-initialises
 * it without a key, which keeps the key's inner and outer pads, so a
 * frame costs the hash of its own bytes only; the payload is fed where
 * it lies, in the pieces the socket moves, never copied. */
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stdlib.h>

#include "transport_tcp.h"
#include "zb_alloc.h"

struct zbtcp_frame_mac {
  EVP_MAC_CTX *ctx;
  bool broken; /* a libcrypto call failed since the frame began */
};

zbtcp_frame_mac *zbtcp_frame_mac_new(const unsigned char *key) {
  EVP_MAC *hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
  EVP_MAC_CTX *ctx = hmac ? EVP_MAC_CTX_new(hmac) : NULL;
  EVP_MAC_free(hmac); /* the context holds its own reference */
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                         OSSL_PARAM_construct_end()};
  if (!ctx || !EVP_MAC_init(ctx, key, TCP_MAC, params)) {
    EVP_MAC_CTX_free(ctx);
    return NULL;
  }
  zbtcp_frame_mac *m = zb_calloc(1, sizeof *m);
  m->ctx = ctx;
  return m;
}

void zbtcp_frame_mac_free(zbtcp_frame_mac *m) {
  if (m) {
    EVP_MAC_CTX_free(m->ctx);
    free(m);
  }
}

/* Starts a tag of part ('h' header, 'f' frame) of frame seq. */
static void mac_start(zbtcp_frame_mac *m, char part, uint64_t seq, const unsigned char *hdr) {
  unsigned char prefix[1 + 8 + TCP_FIELDS];
  prefix[0] = (unsigned char)part;
  put_u64(prefix + 1, seq);
  for (size_t i = 0; i < TCP_FIELDS; i++)
    prefix[9 + i] = hdr[i];
  /* no key: HMAC starts over with the one it has */
  m->broken = !EVP_MAC_init(m->ctx, NULL, 0, NULL) || !EVP_MAC_update(m->ctx, prefix, sizeof prefix);
}

void zbtcp_frame_begin(zbtcp_frame_mac *m, uint64_t seq, const unsigned char *hdr) {
  mac_start(m, 'f', seq, hdr);
}

void zbtcp_frame_add(zbtcp_frame_mac *m, const unsigned char *p, size_t n) {
  if (n > 0 && !m->broken)
    m->broken = !EVP_MAC_update(m->ctx, p, n);
}

bool zbtcp_frame_end(zbtcp_frame_mac *m, unsigned char tag[TCP_TAG]) {
  unsigned char full[EVP_MAX_MD_SIZE];
  size_t len = 0;
  bool ok = !m->broken && EVP_MAC_final(m->ctx, full, &len, sizeof full) && len >= TCP_TAG;
  for (size_t i = 0; i < TCP_TAG; i++)
    tag[i] = ok ? full[i] : 0;
  return ok;
}

bool zbtcp_header_tag(zbtcp_frame_mac *m, uint64_t seq, const unsigned char *hdr,
                      unsigned char tag[TCP_TAG]) {
  mac_start(m, 'h', seq, hdr);
  return zbtcp_frame_end(m, tag);
}

bool zbtcp_tag_equal(const unsigned char *a, const unsigned char *b) {
  return CRYPTO_memcmp(a, b, TCP_TAG) == 0;
}
