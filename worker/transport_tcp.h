/* transport_tcp.h — the tcp transport's private parts, shared by its files
 * (zb_transport.h is its public face):
 *   transport_tcp.c          construction, listening, failure, life cycle;
 *   transport_tcp_data.c     posting and progressing sends and receives;
 *   transport_tcp_connect.c  dialing, accepting and the handshake;
 *   transport_tcp_frame.c    decoding and checking the headers peers send;
 *   transport_tcp_auth.c     the handshake's MACs and the frame keys;
 *   transport_tcp_mac.c      the per-frame MACs (ChaCha20-Poly1305).
 * One TCP connection per pair of ranks, non-blocking sockets, and a poll()
 * loop that moves every posted send and receive of a group at once.
 *
 *
 * Wire format, little-endian:
 *   hello (72 bytes): magic "ZBHL" | version u32 | rank u32 | nranks u32 |
 *            session u64 | nonce [16] | mac [32]
 *   proof (72 bytes): magic "ZBPF", the rest as a hello's, nonce zero
 *   message: a 40-byte header, magic "ZBMS" | kind u32 ('F'/'B'/'R') |
 *            stage i32 | mb i32 | len u64 | header tag [16], then len
 *            payload bytes, then the frame tag [16].
 * The handshake proves that both ends hold the job's data secret (sent by
 * the coordinator with each rank's assignment) without sending it
 * (docs/operations.md, Security): the dialer (lower rank) sends a hello
 * with a fresh nonce; the acceptor answers with its own nonce and
 * mac = HMAC-SHA256(secret, "zb-tcp-accept" | both nonces | both ranks |
 * nranks | session); the dialer checks it and sends a proof with the
 * same MAC under "zb-tcp-dial"; only then is the connection the peer's.
 * A connection that fails the proof is closed and never counted, so a
 * stranger who knows the job id can neither take a rank's place nor
 * open a connection of its own. A receive reads exactly one header, its
 * payload and its tag, so nothing beyond the message it was posted for is
 * consumed.
 *
 * Frame MACs (data-plane version 4): after the handshake every message
 * is authenticated, so a relay on the path can neither change one nor
 * drop, replay or reorder them. Each direction of a connection has its
 * own 256-bit key,
 *   key = HMAC-SHA256(secret, "zb-frame-poly dialer-to-acceptor" (or
 *         "zb-frame-poly acceptor-to-dialer") | both nonces | both ranks |
 *         nranks | session),
 * the handshake's construction under another label: fresh per
 * connection (the nonces), never shared by the two directions. Frames
 * are counted per direction from 0 (seq, never sent: both ends count),
 * and each tag is a ChaCha20-Poly1305 (RFC 8439) tag under the
 * direction's key with an empty plaintext, the authenticated bytes as its
 * additional data, and a 96-bit nonce that no other tag under that key
 * has: direction byte (0 dialer to acceptor, 1 back) | part ('h' or 'f')
 * | two zero bytes | seq u64:
 *   header tag = tag(nonce(dir, 'h', seq), the header's first 24 bytes)
 *   frame tag  = tag(nonce(dir, 'f', seq), the header's first 24 bytes |
 *                payload)
 * Poly1305 keyed per tag by ChaCha20 (the AEAD's one-time key) is a
 * one-time MAC, so the nonce must never repeat under a key: seq only
 * grows, and a new connection has new keys. Version 3 used HMAC-SHA256,
 * several times slower (bench/bench_ring.c prints both); the two cannot
 * talk, and the handshake says so (the version check).
 * The receiver checks the header tag before it trusts the header (so a
 * changed, dropped, replayed or reordered frame is named as such, not as
 * a tag mismatch of the two ranks' lists), feeds the payload to the MAC
 * as it arrives (no copy), and completes the receive only when the frame
 * tag checks: a frame that fails either fails the transport naming the
 * peer's rank and address, and the group never returns its payload. The
 * sender feeds each payload byte to the MAC as the socket takes it.
 * Without a data secret (tests) the session stands in for it, as in the
 * handshake: frames are still checked but anyone who knows the job id
 * could forge them.
 */
#ifndef ZB_TRANSPORT_TCP_H
#define ZB_TRANSPORT_TCP_H

#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "zb_transport.h"

#define TCP_HELLO_MAGIC 0x4c48425au      /* "ZBHL" as bytes on the wire */
#define TCP_MSG_MAGIC 0x534d425au        /* "ZBMS" */
#define TCP_PROOF_MAGIC 0x4650425au      /* "ZBPF" */
#define TCP_VERSION 4u                   /* 3: HMAC frame MACs; 4: ChaCha20-Poly1305 */
#define TCP_FIELDS 24                    /* a message header's fields, before its tag */
#define TCP_TAG 16                       /* a frame MAC: a Poly1305 tag */
#define TCP_FRAME (TCP_FIELDS + TCP_TAG) /* a message header */
#define TCP_HELLO_FRAME 72               /* a hello or a proof */
#define TCP_NONCE 16
#define TCP_MAC 32
#define TCP_KEY_MAX 64
#define TCP_MAC_NONCE 12 /* a frame tag's nonce (Frame MACs) */
#define TCP_POLL_MS 100  /* the longest a wait goes without looking at the stop flag */
#define TCP_BACKOFF_MIN_NS 10000000LL
#define TCP_BACKOFF_MAX_NS 500000000LL
#define TCP_SOCKET_BUFFER (4 << 20)

typedef struct tcp_op {
  bool is_send;
  int peer;
  zb_tag tag;
  unsigned char *buf; /* a send's buffer is never written */
  size_t len;
  unsigned char hdr[TCP_FRAME];
  unsigned char trailer[TCP_TAG]; /* the frame tag: a send's once its payload is out, a receive's as read */
  bool begun;                     /* a send: numbered, header tagged, its MAC fed from here on */
  size_t done;                    /* bytes of header + payload + frame tag moved */
} tcp_op;

/* The bytes of op on the wire. */
static inline size_t tcp_op_total(const tcp_op *op) {
  return TCP_FRAME + op->len + TCP_TAG;
}

/* One direction's frame MAC of a connection (transport_tcp_mac.c). */
typedef struct zbtcp_frame_mac zbtcp_frame_mac;

/* What the transport keeps per connected peer. */
typedef struct tcp_link {
  zbtcp_frame_mac *tx, *rx; /* keyed by the handshake; NULL while not connected */
  uint64_t tx_seq, rx_seq;  /* the next frame's number, each way */
  char address[96];         /* the peer's data address as given, else the socket's */
} tcp_link;

typedef struct tcp_transport {
  int rank, nranks;
  uint64_t session;
  unsigned char key[TCP_KEY_MAX]; /* the data secret the handshake proves */
  size_t key_len;
  const atomic_bool *stop;
  double idle_timeout_s;
  int listen_fd;
  bool owns_listener; /* false: the caller's (zb_tcp_config.has_listener) */
  char address[96];
  int *fds;        /* by rank; -1 when not connected */
  tcp_link *links; /* by rank */
  int depth;
  tcp_op *ops;
  int n_ops, cap_ops;
  struct pollfd *pfds; /* nranks + 1 scratch entries */
  int *pfd_peer;
  int *send_head, *recv_head; /* scratch, by rank */
  zb_err failed;              /* ZB_OK while healthy */
  bool failed_by_peer;        /* the first failure: a peer closed or reset its connection */
  char failure[sizeof(((zb_diag *)0)->msg)];
  zb_transport_stats stats;
} tcp_transport;

/* ---- small helpers (transport_tcp.c, and inline) ---- */

static inline void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static inline void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v |= (uint32_t)p[i] << (8 * i);
  return v;
}

static inline uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static inline bool tcp_stopped(const tcp_transport *t) {
  return t->stop && atomic_load(t->stop);
}

/* strerror_r of e into buf. */
const char *zbtcp_errstr(int e, char *buf, size_t len);
int zbtcp_set_nonblocking(int fd);
/* Socket buffers of TCP_SOCKET_BUFFER bytes each way (the kernel caps them
 * at net.core.wmem_max/rmem_max), set before listen or connect so the
 * window scales: a send of an activation then completes at once, without
 * waiting for the receiver to reach its RECV, as the simulator assumes
 * (docs/model.md, Transports). Best effort. */
void zbtcp_set_buffers(int fd);
/* "host:port" ("[v6]:port") of a socket address. */
void zbtcp_format_sockaddr(const struct sockaddr_storage *ss, char *buf, size_t len);
/* getaddrinfo of "host:port" (host may be "[v6]", empty or "*" when
 * passive); EAI_NONAME for a malformed address. */
int zbtcp_resolve(const char *addr, bool passive, struct addrinfo **out);

/* ---- frame headers (transport_tcp_frame.c) ---- */

/* The byte a tag's kind travels as: 'F', 'B', or 'R' for ZB_OP_REDUCE_GRAD
 * (the ring collectives, zb_collective.h); 0 for a kind that cannot
 * travel. */
static inline uint32_t zbtcp_kind_byte(zb_op kind) {
  return kind == ZB_OP_F ? 'F' : kind == ZB_OP_B ? 'B' : kind == ZB_OP_REDUCE_GRAD ? 'R' : 0;
}

/* A frame header a peer sent, decoded and checked on its own; the
 * transport then compares it with what it waits for. */
typedef struct zbtcp_frame {
  uint32_t magic; /* TCP_MSG_MAGIC, TCP_HELLO_MAGIC or TCP_PROOF_MAGIC */
  /* a message header (TCP_FRAME bytes) */
  zb_tag tag; /* kind ZB_OP_F, ZB_OP_B or ZB_OP_REDUCE_GRAD; stage and mb as sent (any int32) */
  uint64_t len;
  /* a hello or a proof (TCP_HELLO_FRAME bytes) */
  int rank, nranks; /* 0 <= rank < nranks */
  uint64_t session;
  const unsigned char *nonce; /* TCP_NONCE bytes inside the header parsed */
  /* inside the header parsed: a hello's or proof's TCP_MAC bytes, or a
   * message's header tag (TCP_TAG bytes, unchecked here: it needs the key) */
  const unsigned char *mac;
} zbtcp_frame;

/* Decodes the n bytes of a header read from a peer: a message header (n
 * == TCP_FRAME, magic "ZBMS", kind 'F', 'B' or 'R') or a hello or proof (n ==
 * TCP_HELLO_FRAME, magic "ZBHL" or "ZBPF", version TCP_VERSION, a rank of
 * a rank count below 2^31). Anything else is ZB_ERR_PARSE, diag says why;
 * out->magic is the first word whenever n >= 4, so a caller can tell a
 * stranger from a zb frame it refuses. Pure: no I/O and no transport
 * state (fuzz/fuzz_tcp_frame.c drives it with any bytes). */
zb_err zbtcp_frame_parse(const unsigned char *hdr, size_t n, zbtcp_frame *out, zb_diag *diag);

/* ---- failure (transport_tcp.c): poison the transport (like ncclCommAbort) ---- */

/* Records the failure, shuts every connection down (peers see EOF now),
 * drops the posted ops, and returns err set in diag. */
zb_err zbtcp_fail(tcp_transport *t, zb_err err, zb_diag *diag, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The error of a transport that failed before. */
zb_err zbtcp_failed_before(const tcp_transport *t, zb_diag *diag);

/* ---- handshake authentication (transport_tcp_auth.c) ---- */

/* Fills nonce with fresh random bytes. */
void zbtcp_nonce(unsigned char nonce[TCP_NONCE]);
/* HMAC-SHA256 under t's key of label, the dialer's and the acceptor's
 * nonces and ranks, nranks and the session. */
void zbtcp_mac(const tcp_transport *t, const char *label, const unsigned char *nonce_d,
               const unsigned char *nonce_a, int rank_d, int rank_a, unsigned char mac[TCP_MAC]);
/* Whether mac is that MAC (compared in constant time). */
bool zbtcp_mac_ok(const tcp_transport *t, const char *label, const unsigned char *nonce_d,
                  const unsigned char *nonce_a, int rank_d, int rank_a, const unsigned char *mac);
/* The two frame keys of a connection (Frame MACs, above), from the
 * handshake's nonces and ranks. */
void zbtcp_frame_keys(const tcp_transport *t, const unsigned char *nonce_d, const unsigned char *nonce_a,
                      int rank_d, int rank_a, unsigned char to_acceptor[TCP_MAC],
                      unsigned char to_dialer[TCP_MAC]);

/* ---- frame MACs (transport_tcp_mac.c; Frame MACs, above) ---- */

/* The direction byte of a frame tag's nonce. */
#define TCP_DIR_TO_ACCEPTOR 0
#define TCP_DIR_TO_DIALER 1

/* A MAC keyed with key (TCP_MAC bytes, copied into libcrypto's context)
 * for frames in direction (TCP_DIR_*), or NULL when libcrypto cannot make
 * one. Owned by the caller: zbtcp_frame_mac_free (NULL is a no-op). */
zbtcp_frame_mac *zbtcp_frame_mac_new(const unsigned char *key, unsigned char direction);
void zbtcp_frame_mac_free(zbtcp_frame_mac *m);
/* The header tag of frame seq with header hdr (its first TCP_FIELDS
 * bytes count); false when libcrypto failed. */
bool zbtcp_header_tag(zbtcp_frame_mac *m, uint64_t seq, const unsigned char *hdr, unsigned char tag[TCP_TAG]);
/* The frame tag, fed in parts: begin with the header, add the payload as
 * it moves (any pieces), end. End is false when libcrypto failed at any
 * step since begin (the tag is then no tag). One frame at a time per m. */
void zbtcp_frame_begin(zbtcp_frame_mac *m, uint64_t seq, const unsigned char *hdr);
void zbtcp_frame_add(zbtcp_frame_mac *m, const unsigned char *p, size_t n);
bool zbtcp_frame_end(zbtcp_frame_mac *m, unsigned char tag[TCP_TAG]);
/* The nonce of part ('h' or 'f') of frame seq in direction (Frame MACs). */
void zbtcp_mac_nonce(unsigned char direction, char part, uint64_t seq, unsigned char nonce[TCP_MAC_NONCE]);
/* Whether two tags are equal (in constant time). */
bool zbtcp_tag_equal(const unsigned char *a, const unsigned char *b);

/* ---- the vtable's entries in the other files ---- */

/* transport_tcp_connect.c */
zb_err zbtcp_connect(void *self, const char *const *addresses, const bool *peers, double timeout_s,
                     zb_diag *diag);
/* transport_tcp_data.c */
void zbtcp_group_start(void *self);
zb_err zbtcp_group_end(void *self, zb_diag *diag);
zb_err zbtcp_send(void *self, int peer, zb_tag tag, const void *buf, size_t len, zb_diag *diag);
zb_err zbtcp_recv(void *self, int peer, zb_tag tag, void *buf, size_t len, zb_diag *diag);

#endif
