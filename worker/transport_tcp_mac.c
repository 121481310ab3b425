/* transport_tcp_mac.c — the tcp transport's per-frame MACs (transport_tcp.h,
 * Frame MACs): ChaCha20-Poly1305 from OpenSSL's EVP used as a MAC only
 * (the bytes to authenticate are its additional data, the plaintext is
 * empty), one cipher context per direction of a connection, keyed once at
 * the handshake. Each tag sets a fresh nonce on the keyed context (no
 * allocation, no key schedule), so a frame costs Poly1305 over its own
 * bytes and one ChaCha20 block; the payload is fed where it lies, in the
 * pieces the socket moves, never copied. Poly1305 runs at several times
 * HMAC-SHA256's rate (bench/bench_ring.c prints both). */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdlib.h>

#include "transport_tcp.h"
#include "zb_alloc.h"

struct zbtcp_frame_mac {
  EVP_CIPHER_CTX *ctx;
  unsigned char direction; /* the nonce's first byte */
  bool broken;             /* a libcrypto call failed since the tag began */
};

zbtcp_frame_mac *zbtcp_frame_mac_new(const unsigned char *key, unsigned char direction) {
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  unsigned char nonce[TCP_MAC_NONCE] = {0}; /* replaced before every tag */
  if (!ctx || !EVP_EncryptInit_ex(ctx, EVP_chacha20_poly1305(), NULL, key, nonce)) {
    EVP_CIPHER_CTX_free(ctx);
    return NULL;
  }
  zbtcp_frame_mac *m = zb_calloc(1, sizeof *m);
  m->ctx = ctx;
  m->direction = direction;
  return m;
}

void zbtcp_frame_mac_free(zbtcp_frame_mac *m) {
  if (m) {
    EVP_CIPHER_CTX_free(m->ctx); /* wipes the key schedule */
    free(m);
  }
}

void zbtcp_mac_nonce(unsigned char direction, char part, uint64_t seq, unsigned char nonce[TCP_MAC_NONCE]) {
  nonce[0] = direction;
  nonce[1] = (unsigned char)part;
  nonce[2] = 0;
  nonce[3] = 0;
  put_u64(nonce + 4, seq);
}

/* Adds n bytes at p to the tag's additional data. */
static void mac_feed(zbtcp_frame_mac *m, const unsigned char *p, size_t n) {
  while (n > 0 && !m->broken) {
    int piece = n > (size_t)1 << 30 ? 1 << 30 : (int)n, out = 0; /* EVP counts in int */
    m->broken = !EVP_EncryptUpdate(m->ctx, NULL, &out, p, piece);
    p += piece;
    n -= (size_t)piece;
  }
}

/* Starts a tag of part ('h' header, 'f' frame) of frame seq: a fresh
 * nonce, then the header's fields. */
static void mac_start(zbtcp_frame_mac *m, char part, uint64_t seq, const unsigned char *hdr) {
  unsigned char nonce[TCP_MAC_NONCE];
  zbtcp_mac_nonce(m->direction, part, seq, nonce);
  m->broken = !EVP_EncryptInit_ex(m->ctx, NULL, NULL, NULL, nonce);
  mac_feed(m, hdr, TCP_FIELDS);
}

void zbtcp_frame_begin(zbtcp_frame_mac *m, uint64_t seq, const unsigned char *hdr) {
  mac_start(m, 'f', seq, hdr);
}

void zbtcp_frame_add(zbtcp_frame_mac *m, const unsigned char *p, size_t n) {
  mac_feed(m, p, n);
}

bool zbtcp_frame_end(zbtcp_frame_mac *m, unsigned char tag[TCP_TAG]) {
  unsigned char none[16]; /* the empty plaintext's last block: never written */
  int out = 0;
  bool ok = !m->broken && EVP_EncryptFinal_ex(m->ctx, none, &out) && out == 0 &&
            EVP_CIPHER_CTX_ctrl(m->ctx, EVP_CTRL_AEAD_GET_TAG, TCP_TAG, tag) == 1;
  if (!ok)
    OPENSSL_cleanse(tag, TCP_TAG); /* no tag, and nothing that could pass for one */
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
