/* nccl_standin_boot.c — the NCCL stand-in's bootstrap (test-only;
 * nccl_standin.h has the id's layout): ncclGetUniqueId, the rendezvous
 * root it starts in the calling process (like NCCL's bootstrap root), and
 * the joining of one rank.
 *
 * Rendezvous, little-endian: each rank dials the root and sends
 *   "ZBRV" | rank u32 | nranks u32 | session u64 | address length u32 | address
 * (its tcp transport's "host:port"); when all nranks ranks have registered
 * the root answers each with nranks u32 and every rank's address (u32
 * length | bytes), and exits. A rank then connects to every other rank.
 *
 * Threads: the root is a detached thread per id; a joining rank runs on
 * its communicator's init thread and checks the abort flag every 100 ms.
 * Errors land in the communicator (ncclsi_error) and on stderr.
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nccl_standin.h"
#include "zb_clock.h"

#define RV_MAGIC 0x5652425au /* "ZBRV" */
#define RV_ADDR_MAX 200      /* "DATA,ACK": two host:port */
#define RV_ROOT_LIFE_S 600.0 /* a root nobody completes gives up */

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Moves exactly n bytes (send or receive) on a blocking socket, waiting at
 * most 100 ms at a time; gives up when *abort is raised or deadline_ns
 * (0: none) passes. 0 on success, else an errno-like code (ETIMEDOUT,
 * ECANCELED, EPIPE for a closed peer). */
static int rv_io(int fd, void *buf, size_t n, bool out, const atomic_bool *abort, int64_t deadline_ns) {
  unsigned char *p = buf;
  size_t done = 0;
  while (done < n) {
    if (abort && atomic_load(abort))
      return ECANCELED;
    if (deadline_ns && zb_clock_ns() > deadline_ns)
      return ETIMEDOUT;
    struct pollfd pf = {.fd = fd, .events = out ? POLLOUT : POLLIN};
    int rc = poll(&pf, 1, 100);
    if (rc < 0 && errno != EINTR)
      return errno;
    if (rc <= 0)
      continue;
    ssize_t k = out ? send(fd, p + done, n - done, MSG_NOSIGNAL) : recv(fd, p + done, n - done, 0);
    if (k == 0)
      return EPIPE;
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      return errno;
    }
    done += (size_t)k;
  }
  return 0;
}

/* ---- the root ---- */

typedef struct rv_root {
  int listen_fd;
  uint64_t session;
} rv_root;

typedef struct rv_member {
  int fd;
  char addr[RV_ADDR_MAX];
} rv_member;

/* Reads one registration into members; false (and the connection closed)
 * for a stray or inconsistent one. */
static bool rv_register(rv_root *r, int fd, rv_member **members, int *nranks, int *joined) {
  unsigned char h[24];
  int64_t deadline = zb_clock_ns() + 10 * 1000000000LL;
  if (rv_io(fd, h, sizeof h, false, NULL, deadline) != 0 || get32(h) != RV_MAGIC)
    goto bad;
  uint32_t rank = get32(h + 4), n = get32(h + 8), alen = get32(h + 20);
  uint64_t session = (uint64_t)get32(h + 12) | (uint64_t)get32(h + 16) << 32;
  if (session != r->session || n == 0 || n > 65536 || rank >= n || alen == 0 || alen >= RV_ADDR_MAX)
    goto bad;
  if (*nranks == 0) {
    *nranks = (int)n;
    *members = calloc(n, sizeof **members);
    for (uint32_t q = 0; q < n; q++)
      (*members)[q].fd = -1;
  }
  if ((int)n != *nranks || (*members)[rank].fd >= 0) {
    fprintf(stderr, "nccl stand-in: root: rank %u of %u refused (%s)\n", rank, n,
            (int)n != *nranks ? "nranks differs from the first rank's" : "rank joined twice");
    goto bad;
  }
  rv_member *m = &(*members)[rank];
  if (rv_io(fd, m->addr, alen, false, NULL, deadline) != 0)
    goto bad;
  m->addr[alen] = '\0';
  m->fd = fd;
  (*joined)++;
  return true;
bad:
  close(fd);
  return false;
}

/* Sends every member the address table. */
static void rv_answer(rv_member *members, int nranks) {
  for (int q = 0; q < nranks; q++) {
    unsigned char n4[4];
    put32(n4, (uint32_t)nranks);
    int e = rv_io(members[q].fd, n4, 4, true, NULL, 0);
    for (int k = 0; k < nranks && !e; k++) {
      size_t len = strlen(members[k].addr);
      put32(n4, (uint32_t)len);
      e = rv_io(members[q].fd, n4, 4, true, NULL, 0);
      if (!e)
        e = rv_io(members[q].fd, members[k].addr, len, true, NULL, 0);
    }
    if (e)
      fprintf(stderr, "nccl stand-in: root: rank %d left before its answer\n", q);
  }
}

static void *rv_root_main(void *arg) {
  rv_root *r = arg;
  rv_member *members = NULL;
  int nranks = 0, joined = 0;
  int64_t end = zb_clock_ns() + (int64_t)(RV_ROOT_LIFE_S * 1e9);
  while (nranks == 0 || joined < nranks) {
    if (zb_clock_ns() > end) {
      fprintf(stderr, "nccl stand-in: root: %d of %d ranks joined in %.0f s; giving up\n", joined, nranks,
              RV_ROOT_LIFE_S);
      break;
    }
    struct pollfd pf = {.fd = r->listen_fd, .events = POLLIN};
    if (poll(&pf, 1, 100) <= 0)
      continue;
    int fd = accept(r->listen_fd, NULL, NULL);
    if (fd >= 0)
      rv_register(r, fd, &members, &nranks, &joined);
  }
  if (nranks > 0 && joined == nranks)
    rv_answer(members, nranks);
  for (int q = 0; q < nranks; q++)
    if (members[q].fd >= 0)
      close(members[q].fd);
  free(members);
  close(r->listen_fd);
  free(r);
  return NULL;
}

/* ---- ids ---- */

/* The real libnccl's ncclGetUniqueId, or ncclSystemError when the library
 * cannot be loaded (logged once). */
static ncclResult_t real_unique_id(ncclUniqueId *id) {
  typedef ncclResult_t (*get_fn)(ncclUniqueId *);
  static get_fn fn;
  static bool tried;
  if (!tried) {
    tried = true;
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h)
      h = dlopen("/usr/local/cuda/lib64/libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (h)
      fn = (get_fn)(uintptr_t)dlsym(h, "ncclGetUniqueId");
    if (!fn)
      fprintf(stderr, "nccl stand-in: the real libnccl cannot be loaded (%s); ids are the stand-in's only\n",
              h ? "no ncclGetUniqueId" : dlerror());
  }
  return fn ? fn(id) : ncclSystemError;
}

static ncclResult_t random_bytes(void *p, size_t n) {
  int fd = open("/dev/urandom", O_RDONLY);
  ssize_t k = fd >= 0 ? read(fd, p, n) : -1;
  if (fd >= 0)
    close(fd);
  return k == (ssize_t)n ? ncclSuccess : ncclSystemError;
}

/* A listening socket on ZB_STANDIN_NCCL_HOST (IPv4, default 127.0.0.1). */
static int rv_listen(struct sockaddr_in *sa) {
  const char *host = getenv("ZB_STANDIN_NCCL_HOST");
  *sa = (struct sockaddr_in){.sin_family = AF_INET};
  if (inet_pton(AF_INET, host && *host ? host : "127.0.0.1", &sa->sin_addr) != 1)
    return -1;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  socklen_t sl = sizeof *sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)sa, sizeof *sa) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, (struct sockaddr *)sa, &sl) != 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  return fd;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  if (!uniqueId)
    return ncclsi_error(NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (real_unique_id(&id) == ncclSuccess) {
    for (int i = NCCLSI_TAIL; i < NCCL_UNIQUE_ID_BYTES; i++)
      if (id.internal[i])
        return ncclsi_error(NULL, ncclInternalError,
                            "ncclGetUniqueId: the real NCCL id uses byte %d, where the stand-in keeps its "
                            "rendezvous (bytes %d..127 must be zero)",
                            i, NCCLSI_TAIL);
  } else if (random_bytes(&id, NCCLSI_TAIL) != ncclSuccess) {
    return ncclsi_error(NULL, ncclSystemError, "ncclGetUniqueId: /dev/urandom: %s", strerror(errno));
  }
  struct sockaddr_in sa;
  int fd = rv_listen(&sa);
  if (fd < 0)
    return ncclsi_error(NULL, ncclSystemError, "ncclGetUniqueId: the stand-in root cannot listen: %s",
                        strerror(errno));
  unsigned char *tail = (unsigned char *)id.internal + NCCLSI_TAIL;
  memcpy(tail, NCCLSI_MAGIC, 8);
  memcpy(tail + 8, &sa.sin_addr.s_addr, 4);
  memcpy(tail + 12, &sa.sin_port, 2);
  rv_root *r = malloc(sizeof *r);
  r->listen_fd = fd;
  memcpy(&r->session, id.internal, 8);
  pthread_t th;
  if (pthread_create(&th, NULL, rv_root_main, r) != 0) {
    close(fd);
    free(r);
    return ncclsi_error(NULL, ncclSystemError, "ncclGetUniqueId: cannot start the root thread");
  }
  pthread_detach(th);
  *uniqueId = id;
  return ncclSuccess;
}

/* ---- joining ---- */

/* Registers with the root and reads every rank's address into addrs. */
static ncclResult_t rv_join(ncclComm_t c, const char *mine, char **addrs) {
  const unsigned char *tail = (const unsigned char *)c->id.internal + NCCLSI_TAIL;
  struct sockaddr_in sa = {.sin_family = AF_INET};
  memcpy(&sa.sin_addr.s_addr, tail + 8, 4);
  memcpy(&sa.sin_port, tail + 12, 2);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    return ncclsi_error(c, ncclSystemError, "init: rank %d cannot reach the rendezvous root: %s", c->rank,
                        strerror(e));
  }
  unsigned char h[24];
  size_t alen = strlen(mine);
  put32(h, RV_MAGIC);
  put32(h + 4, (uint32_t)c->rank);
  put32(h + 8, (uint32_t)c->nranks);
  put32(h + 12, (uint32_t)c->session);
  put32(h + 16, (uint32_t)(c->session >> 32));
  put32(h + 20, (uint32_t)alen);
  int e = rv_io(fd, h, sizeof h, true, &c->aborted, 0);
  if (!e)
    e = rv_io(fd, (void *)(uintptr_t)mine, alen, true, &c->aborted, 0);
  unsigned char n4[4];
  if (!e)
    e = rv_io(fd, n4, 4, false, &c->aborted, 0);
  if (!e && get32(n4) != (uint32_t)c->nranks)
    e = EPROTO;
  for (int q = 0; q < c->nranks && !e; q++) {
    e = rv_io(fd, n4, 4, false, &c->aborted, 0);
    uint32_t len = e ? 0 : get32(n4);
    if (!e && (len == 0 || len >= RV_ADDR_MAX))
      e = EPROTO;
    addrs[q] = calloc(1, len + 1);
    if (!e)
      e = rv_io(fd, addrs[q], len, false, &c->aborted, 0);
  }
  close(fd);
  if (e)
    return ncclsi_error(c, e == ECANCELED ? ncclInvalidUsage : ncclSystemError,
                        "init: rank %d of %d: rendezvous with the root failed: %s", c->rank, c->nranks,
                        e == ECANCELED ? "aborted"
                        : e == EPIPE   ? "root closed (ranks disagree?)"
                                       : strerror(e));
  return ncclSuccess;
}

/* Splits "DATA,ACK" (one rank's two listening addresses) in place;
 * returns the ACK part, or NULL when the entry is malformed. */
static char *rv_split(char *both) {
  char *comma = both ? strchr(both, ',') : NULL;
  if (!comma)
    return NULL;
  *comma = '\0';
  return comma + 1;
}

/* The two transports of a communicator (data and acknowledgements), and
 * one listening address for both: "DATA,ACK". */
static ncclResult_t join_transports(ncclComm_t c, zb_transport **tp, char *both, size_t len) {
  const char *host = getenv("ZB_STANDIN_NCCL_HOST");
  char listen[80];
  snprintf(listen, sizeof listen, "%s:0", host && *host ? host : "127.0.0.1");
  zb_tcp_config cfg = {.rank = c->rank,
                       .nranks = c->nranks,
                       .listen = listen,
                       .session = c->session,
                       .stop = &c->aborted,
                       .idle_timeout_s = ncclsi_timeout_s()};
  zb_diag d;
  for (int k = 0; k < 2; k++) {
    cfg.session = c->session ^ (uint64_t)k; /* an ack connection never passes for a data one */
    if (zb_transport_tcp_new(&cfg, &tp[k], &d) != ZB_OK)
      return ncclsi_error(c, ncclSystemError, "init: rank %d: %s", c->rank, d.msg);
  }
  snprintf(both, len, "%s,%s", zb_transport_address(tp[0]), zb_transport_address(tp[1]));
  return ncclSuccess;
}

/* Connects both transports to every rank, from the joined address table. */
static ncclResult_t join_connect(ncclComm_t c, zb_transport **tp, char **addrs) {
  char **acks = calloc((size_t)c->nranks, sizeof *acks);
  ncclResult_t res = ncclSuccess;
  for (int q = 0; q < c->nranks && !res; q++)
    if (!(acks[q] = rv_split(addrs[q])))
      res = ncclsi_error(c, ncclSystemError, "init: rank %d: rank %d's address '%s' is not DATA,ACK", c->rank,
                         q, addrs[q]);
  zb_diag d;
  for (int k = 0; k < 2 && !res; k++)
    if (zb_transport_connect(tp[k], (const char *const *)(k ? acks : addrs), NULL, 0, &d) != ZB_OK)
      res = ncclsi_error(c, atomic_load(&c->aborted) ? ncclInvalidUsage : ncclRemoteError,
                         "init: rank %d: %s", c->rank, d.msg);
  free(acks);
  return res;
}

void *ncclsi_join(void *arg) {
  ncclComm_t c = arg;
  zb_transport *tp[2] = {NULL, NULL};
  char both[RV_ADDR_MAX];
  char **addrs = calloc((size_t)c->nranks, sizeof *addrs);
  ncclResult_t res = join_transports(c, tp, both, sizeof both);
  if (!res)
    res = rv_join(c, both, addrs);
  if (!res)
    res = join_connect(c, tp, addrs);
  for (int q = 0; q < c->nranks; q++)
    free(addrs[q]);
  free(addrs);
  pthread_mutex_lock(&c->mu);
  if (!res) {
    c->tp = tp[0];
    c->ack = tp[1];
    tp[0] = tp[1] = NULL;
    if (c->async == ncclInProgress)
      c->async = ncclSuccess;
  }
  c->init_running = false;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  zb_transport_free(tp[0]);
  zb_transport_free(tp[1]);
  if (!res)
    fprintf(stderr, "nccl stand-in: rank %d of %d joined (CPU stand-in over tcp, not NCCL)\n", c->rank,
            c->nranks);
  return NULL;
}
