/* transport_tcp_auth.c — the MACs of the tcp transport's handshake and the
 * frame keys derived from it (transport_tcp.h): HMAC-SHA256 from OpenSSL's
 * libcrypto, nonces from the kernel's random source. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>
#include <sys/random.h>

#include "transport_tcp.h"

void zbtcp_nonce(unsigned char nonce[TCP_NONCE]) {
  size_t got = 0;
  while (got < TCP_NONCE) {
    ssize_t n = getrandom(nonce + got, TCP_NONCE - got, 0);
    if (n > 0)
      got += (size_t)n;
  }
}

void zbtcp_mac(const tcp_transport *t, const char *label, const unsigned char *nonce_d,
               const unsigned char *nonce_a, int rank_d, int rank_a, unsigned char mac[TCP_MAC]) {
  unsigned char msg[64 + 2 * TCP_NONCE + 20];
  size_t n = strlen(label) + 1; /* the NUL separates the label from what follows */
  memcpy(msg, label, n);
  memcpy(msg + n, nonce_d, TCP_NONCE);
  memcpy(msg + n + TCP_NONCE, nonce_a, TCP_NONCE);
  n += 2 * TCP_NONCE;
  put_u32(msg + n, (uint32_t)rank_d);
  put_u32(msg + n + 4, (uint32_t)rank_a);
  put_u32(msg + n + 8, (uint32_t)t->nranks);
  put_u64(msg + n + 12, t->session);
  n += 20;
  unsigned int len = TCP_MAC;
  HMAC(EVP_sha256(), t->key, (int)t->key_len, msg, n, mac, &len);
}

bool zbtcp_mac_ok(const tcp_transport *t, const char *label, const unsigned char *nonce_d,
                  const unsigned char *nonce_a, int rank_d, int rank_a, const unsigned char *mac) {
  unsigned char want[TCP_MAC];
  zbtcp_mac(t, label, nonce_d, nonce_a, rank_d, rank_a, want);
  return CRYPTO_memcmp(want, mac, TCP_MAC) == 0;
}

void zbtcp_frame_keys(const tcp_transport *t, const unsigned char *nonce_d, const unsigned char *nonce_a,
                      int rank_d, int rank_a, unsigned char to_acceptor[TCP_MAC],
                      unsigned char to_dialer[TCP_MAC]) {
  zbtcp_mac(t, "zb-frame-poly dialer-to-acceptor", nonce_d, nonce_a, rank_d, rank_a, to_acceptor);
  zbtcp_mac(t, "zb-frame-poly acceptor-to-dialer", nonce_d, nonce_a, rank_d, rank_a, to_dialer);
}
