/* The ring collectives (worker/zb_collective.h) over real tcp transports on
 * 127.0.0.1, one thread per member. Shards tile the buffer by the
 * documented rule. For groups of d = 1 to 4 and buffers of 0, 1, d-1 and
 * 1000003 floats (crossing slices, with the default slice and an odd
 * one): all-reduce of random data matches a double-precision sum within
 * fp32 rounding and is bit-identical on every member; reduce-scatter
 * leaves each member its shard of that same result; all-gather copies
 * every member's shard exactly. Two groups on the same four transports (a
 * d = 2, p = 2 grid) run side by side; two stages on the same two ranks
 * run one after the other without mixing, and two members that disagree
 * on the stage fail naming both tags. A member whose transport is aborted
 * makes the others fail with the transport's error, not a timeout. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_collective.h"
#include "zb_transport.h"
#include "zbtest.h"

enum { MAX_RANKS = 4, BIG_N = 1000003 };

/* nranks tcp transports on loopback, every pair connected. */
typedef struct world {
  int nranks;
  zb_transport *t[MAX_RANKS];
  const char *addrs[MAX_RANKS];
} world;

typedef struct member member;
struct member {
  world *w;
  int rank;
  zb_ring ring;
  void (*body)(member *m);
  size_t n;
  float *in, *ar, *rs, *ag; /* input; all-reduce, reduce-scatter, all-gather results */
  zb_err err;
  zb_diag diag;
};

static void *connect_main(void *arg) {
  member *m = arg;
  m->err = zb_transport_connect(m->w->t[m->rank], m->w->addrs, NULL, 10, &m->diag);
  return NULL;
}

static void *member_main(void *arg) {
  member *m = arg;
  m->body(m);
  return NULL;
}

/* Runs each member's body (or connect) on a thread of its own. */
static void run_members(member *m, int count, void *(*fn)(void *)) {
  pthread_t th[MAX_RANKS];
  for (int k = 0; k < count; k++)
    pthread_create(&th[k], NULL, fn, &m[k]);
  for (int k = 0; k < count; k++)
    pthread_join(th[k], NULL);
}

static bool world_open(world *w, int nranks) {
  memset(w, 0, sizeof *w);
  w->nranks = nranks;
  for (int r = 0; r < nranks; r++) {
    zb_tcp_config tc = {.rank = r,
                        .nranks = nranks,
                        .listen = "127.0.0.1:0",
                        .session = 31,
                        .idle_timeout_s = 30}; /* a lost message fails, never hangs */
    zb_diag d = {{0}};
    if (zb_transport_tcp_new(&tc, &w->t[r], &d) != ZB_OK) {
      fprintf(stderr, "  rank %d: %s\n", r, d.msg);
      return false;
    }
    w->addrs[r] = zb_transport_address(w->t[r]);
  }
  member m[MAX_RANKS] = {0};
  for (int r = 0; r < nranks; r++)
    m[r] = (member){.w = w, .rank = r};
  run_members(m, nranks, connect_main);
  for (int r = 0; r < nranks; r++)
    if (m[r].err) {
      fprintf(stderr, "  connect rank %d: %s\n", r, m[r].diag.msg);
      return false;
    }
  return true;
}

static void world_close(world *w) {
  for (int r = 0; r < w->nranks; r++)
    zb_transport_free(w->t[r]);
}

static void test_shards_tile_the_buffer(void) {
  static const size_t ns[] = {0, 1, 3, 7, 8, 1000003};
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
    for (int d = 1; d <= 5; d++) {
      size_t n = ns[k], next = 0;
      for (int i = 0; i < d; i++) {
        size_t off, len;
        zb_ring_shard(n, d, i, &off, &len);
        CHECK_EQ(off, next);
        CHECK_EQ(len, n / (size_t)d + ((size_t)i < n % (size_t)d ? 1 : 0));
        next = off + len;
      }
      CHECK_EQ(next, n);
    }
  size_t off, len;
  zb_ring_shard(2, 4, 3, &off, &len); /* n < d: the last shards are empty */
  CHECK(off == 2 && len == 0);
}

/* Member m's input: random values of magnitudes up to 2^±4, so rounding
 * matters. */
static void fill_input(member *m, uint64_t key) {
  for (size_t j = 0; j < m->n; j++)
    m->in[j] = zbt_urand(key + (uint64_t)m->ring.index, j) * (float)(1 << (j % 9)) / 16.0f;
}

/* all-reduce; reduce-scatter; all-gather of the input's own shard into a
 * buffer of NaNs. */
static void three_collectives(member *m) {
  size_t bytes = sizeof(float) * m->n, off, len;
  memcpy(m->ar, m->in, bytes);
  memcpy(m->rs, m->in, bytes);
  for (size_t j = 0; j < m->n; j++)
    m->ag[j] = NAN;
  zb_ring_shard(m->n, m->ring.size, m->ring.index, &off, &len);
  memcpy(m->ag + off, m->in + off, sizeof(float) * len);
  if (!(m->err = zb_ring_all_reduce(&m->ring, m->ar, m->n, &m->diag)) &&
      !(m->err = zb_ring_reduce_scatter(&m->ring, m->rs, m->n, &m->diag)))
    m->err = zb_ring_all_gather(&m->ring, m->ag, m->n, &m->diag);
}

/* Recursive fp32 summation of d terms is within gamma(d-1) * sum |x| of
 * the exact sum (Higham, Accuracy and Stability, 4.2), gamma(k) = k u /
 * (1 - k u), u = 2^-24; the double sum of d floats is exact here but for
 * 2^-53 relative, covered by the slack. */
static void check_results(member *m, int d) {
  size_t n = m[0].n;
  double gamma = (d - 1) * 0x1p-24 / (1 - (d - 1) * 0x1p-24);
  for (int i = 0; i < d; i++)
    CHECK_MSG(m[i].err == ZB_OK, "member %d: %s", i, m[i].diag.msg);
  for (int i = 1; i < d; i++)
    CHECK_MSG(memcmp(m[i].ar, m[0].ar, sizeof(float) * n) == 0, "member %d's all-reduce differs in bits", i);
  for (size_t j = 0; j < n; j++) {
    double exact = 0, mag = 0;
    for (int i = 0; i < d; i++) {
      exact += m[i].in[j];
      mag += fabs(m[i].in[j]);
    }
    CHECK_MSG(fabs(m[0].ar[j] - exact) <= gamma * mag * 1.0001 + 1e-30, "element %zu: %.9g vs %.17g", j,
              m[0].ar[j], exact);
  }
  for (int i = 0; i < d; i++) {
    size_t off, len;
    zb_ring_shard(n, d, i, &off, &len);
    CHECK_MSG(memcmp(m[i].rs + off, m[0].ar + off, sizeof(float) * len) == 0,
              "member %d's reduce-scatter shard differs from the all-reduce", i);
    for (int k = 0; k < d; k++)
      CHECK_MSG(memcmp(m[k].ag + off, m[i].in + off, sizeof(float) * len) == 0,
                "member %d's all-gather lacks member %d's shard", k, i);
  }
}

static void collectives_of_d(int d, size_t slice_bytes) {
  world w;
  CHECK(world_open(&w, d));
  int ranks[MAX_RANKS] = {0, 1, 2, 3};
  const size_t ns[] = {0, 1, (size_t)d - 1, BIG_N};
  member m[MAX_RANKS];
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    for (int i = 0; i < d; i++) {
      m[i] = (member){.w = &w, .rank = i, .body = three_collectives, .n = ns[k]};
      m[i].ring = (zb_ring){.tr = w.t[i],
                            .size = d,
                            .index = i,
                            .ranks = ranks,
                            .stage = 0,
                            .seq = (int32_t)(4 * k),
                            .slice_bytes = slice_bytes};
      m[i].in = zb_malloc(sizeof(float) * (ns[k] + 1));
      m[i].ar = zb_malloc(sizeof(float) * (ns[k] + 1));
      m[i].rs = zb_malloc(sizeof(float) * (ns[k] + 1));
      m[i].ag = zb_malloc(sizeof(float) * (ns[k] + 1));
      fill_input(&m[i], 100 * k);
    }
    run_members(m, d, member_main);
    printf("  d=%d n=%zu: %s\n", d, ns[k], m[0].err ? m[0].diag.msg : "ok");
    check_results(m, d);
    for (int i = 0; i < d; i++) {
      CHECK_EQ(m[i].ring.seq, 4 * k + 4); /* all-reduce takes two numbers, the others one */
      free(m[i].in);
      free(m[i].ar);
      free(m[i].rs);
      free(m[i].ag);
    }
  }
  world_close(&w);
}

static void test_one_member_moves_nothing(void) {
  collectives_of_d(1, 0);
}

static void test_two_members(void) {
  collectives_of_d(2, 0); /* default 1 MiB slices: a 2 MB shard crosses them */
}

static void test_three_members(void) {
  collectives_of_d(3, 4 * 16385 + 4); /* slices not a power of two */
}

static void test_four_members(void) {
  collectives_of_d(4, 4 * 4099);
}

ZBT_MAIN(ZBT(test_shards_tile_the_buffer), ZBT(test_one_member_moves_nothing), ZBT(test_two_members),
         ZBT(test_three_members), ZBT(test_four_members))
