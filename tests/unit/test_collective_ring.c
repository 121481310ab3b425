/* The ring collectives (worker/zb_collective.h) over real tcp transports on
 * 127.0.0.1, one thread per member. Shards tile the buffer by the
 * documented rule. For groups of d = 1 to 4 and buffers of 0, 1, d-1 and
 * 1000003 floats (crossing slices, with the default slice and an odd
 * one): all-reduce of random data matches a double-precision sum within
 * fp32 rounding, is bit-identical on every member and sends 2(d-1)/d of
 * the buffer; reduce-scatter
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
#include <time.h>

#include "zb_alloc.h"
#include "zb_collective.h"
#include "zb_transport.h"
#include "zbtest.h"

enum { MAX_RANKS = 4, BIG_N = 1000003 };

/* nranks tcp transports on loopback, every pair connected. */
typedef struct world {
  int nranks;
  atomic_bool stop;
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
  int64_t ar_sent;          /* payload bytes the all-reduce sent */
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
                        .stop = &w->stop,
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
  zb_transport_stats before, after;
  zb_transport_stats_get(m->ring.tr, &before);
  m->err = zb_ring_all_reduce(&m->ring, m->ar, m->n, &m->diag);
  zb_transport_stats_get(m->ring.tr, &after);
  m->ar_sent = after.bytes_sent - before.bytes_sent;
  if (!m->err && !(m->err = zb_ring_reduce_scatter(&m->ring, m->rs, m->n, &m->diag)))
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
    size_t off, len, off1, len1;
    zb_ring_shard(n, d, i, &off, &len);
    zb_ring_shard(n, d, (i + 1) % d, &off1, &len1);
    /* bandwidth-optimal: every shard but its own, then every shard but its successor's */
    CHECK_EQ(m[i].ar_sent, d == 1 ? 0 : (int64_t)(sizeof(float) * (2 * n - len - len1)));
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

/* A member of the d = 2, p = 2 grid: rank g = replica * 2 + r all-reduces
 * stage r with replica 2 + r... and then stage r + 2 (a second chunk on
 * the same ranks, as with v = 2) over the same connections. */
static int grid_ranks[2][2] = {{0, 2}, {1, 3}};

static void two_stages(member *m) {
  int r = m->rank % 2;
  m->ring =
      (zb_ring){.tr = m->w->t[m->rank], .size = 2, .index = m->rank / 2, .ranks = grid_ranks[r], .stage = r};
  if ((m->err = zb_ring_all_reduce(&m->ring, m->ar, m->n, &m->diag)))
    return;
  m->ring.stage = r + 2;
  m->ring.seq = 0; /* another group: numbered on its own */
  m->err = zb_ring_all_reduce(&m->ring, m->rs, m->n, &m->diag);
}

static void test_groups_share_transports(void) {
  world w;
  CHECK(world_open(&w, 4));
  enum { N = 300007 };
  member m[4];
  for (int g = 0; g < 4; g++) {
    m[g] = (member){.w = &w, .rank = g, .body = two_stages, .n = N};
    m[g].ar = zb_malloc(sizeof(float) * N);
    m[g].rs = zb_malloc(sizeof(float) * N);
    for (size_t j = 0; j < N; j++) {
      m[g].ar[j] = (float)(g + 1);        /* stage r: (r + 1) + (r + 3) */
      m[g].rs[j] = (float)(16 * (g + 1)); /* stage r + 2: 16 times that */
    }
  }
  run_members(m, 4, member_main);
  for (int g = 0; g < 4; g++) {
    int r = g % 2;
    CHECK_MSG(m[g].err == ZB_OK, "rank %d: %s", g, m[g].diag.msg);
    for (size_t j = 0; j < N; j++) {
      CHECK_MSG(m[g].ar[j] == (float)(2 * r + 4), "rank %d stage %d [%zu]: %g", g, r, j, m[g].ar[j]);
      CHECK_MSG(m[g].rs[j] == (float)(16 * (2 * r + 4)), "rank %d stage %d [%zu]: %g", g, r + 2, j,
                m[g].rs[j]);
    }
    free(m[g].ar);
    free(m[g].rs);
  }
  world_close(&w);
}

/* Member 1 runs its stages in the other order: stage 1 first. */
static void stages_swapped(member *m) {
  static const int pair[2] = {0, 1};
  m->ring = (zb_ring){.tr = m->w->t[m->rank], .size = 2, .index = m->rank, .ranks = pair};
  for (int k = 0; k < 2 && !m->err; k++) {
    m->ring.stage = m->rank == 0 ? k : 1 - k;
    m->ring.seq = 0;
    m->err = zb_ring_all_reduce(&m->ring, m->ar, m->n, &m->diag);
  }
}

static void test_a_stage_mismatch_names_both_tags(void) {
  world w;
  CHECK(world_open(&w, 2));
  member m[2];
  float buf[2][64] = {{0}};
  for (int i = 0; i < 2; i++)
    m[i] = (member){.w = &w, .rank = i, .body = stages_swapped, .n = 64, .ar = buf[i]};
  run_members(m, 2, member_main);
  bool named = false;
  for (int i = 0; i < 2; i++) {
    printf("  member %d: %s\n", i, m[i].diag.msg);
    CHECK(m[i].err != ZB_OK);
    named = named || (m[i].err == ZB_ERR_INVALID_SCHEDULE && strstr(m[i].diag.msg, "R s0 mb0") &&
                      strstr(m[i].diag.msg, "R s1 mb0"));
  }
  CHECK(named);
  world_close(&w);
}

/* Member 3 aborts its transport; the others all-reduce a large buffer. */
static void member_3_aborts(member *m) {
  if (m->rank == 3)
    zb_transport_abort(m->w->t[3], "member 3 went away");
  m->err = zb_ring_all_reduce(&m->ring, m->ar, m->n, &m->diag);
}

static void test_an_aborted_member_fails_the_others(void) {
  world w;
  CHECK(world_open(&w, 4));
  int ranks[4] = {0, 1, 2, 3};
  member m[4];
  for (int i = 0; i < 4; i++) {
    m[i] = (member){.w = &w, .rank = i, .body = member_3_aborts, .n = BIG_N};
    m[i].ring = (zb_ring){.tr = w.t[i], .size = 4, .index = i, .ranks = ranks};
    m[i].ar = zb_calloc(BIG_N, sizeof(float));
  }
  run_members(m, 4, member_main);
  for (int i = 0; i < 4; i++) {
    printf("  member %d: %s\n", i, m[i].diag.msg);
    CHECK(m[i].err == ZB_ERR_IO);
    CHECK(!strstr(m[i].diag.msg, "no progress")); /* the transport's error, not the idle timeout */
    free(m[i].ar);
  }
  CHECK(strstr(m[0].diag.msg, "peer rank 3")); /* member 0 receives from member 3 */
  CHECK(strstr(m[3].diag.msg, "member 3 went away"));
  world_close(&w);
}

/* Member 0 passes a bad index; member 1 raises nothing and must not hang. */
static void bad_index_or_stop(member *m) {
  static const int pair[2] = {0, 1};
  m->ring = (zb_ring){.tr = m->w->t[m->rank], .size = 2, .index = m->rank == 0 ? 5 : 1, .ranks = pair};
  m->err = zb_ring_all_reduce(&m->ring, m->ar, m->n, &m->diag);
}

static void test_bad_arguments_fail_both_members(void) {
  world w;
  CHECK(world_open(&w, 2));
  member m[2];
  float buf[2][8] = {{0}};
  for (int i = 0; i < 2; i++)
    m[i] = (member){.w = &w, .rank = i, .body = bad_index_or_stop, .n = 8, .ar = buf[i]};
  run_members(m, 2, member_main);
  printf("  member 0: %s\n  member 1: %s\n", m[0].diag.msg, m[1].diag.msg);
  CHECK(m[0].err == ZB_ERR_INVALID_ARG && strstr(m[0].diag.msg, "member index 5 is not in 0..1"));
  CHECK(m[1].err == ZB_ERR_IO && strstr(m[1].diag.msg, "peer rank 0 closed")); /* not the idle timeout */
  world_close(&w);
}

/* Member 1 never joins; it raises the stop flag instead. */
static void waits_or_stops(member *m) {
  static const int pair[2] = {0, 1};
  if (m->rank == 1) {
    struct timespec pause = {.tv_nsec = 100 * 1000 * 1000}; /* let member 0 wait; nothing depends on it */
    nanosleep(&pause, NULL);
    atomic_store(&m->w->stop, true);
    return;
  }
  m->ring = (zb_ring){.tr = m->w->t[0], .size = 2, .index = 0, .ranks = pair, .stage = 4};
  m->err = zb_ring_all_reduce(&m->ring, m->ar, m->n, &m->diag);
}

static void test_the_stop_flag_ends_a_wait(void) {
  world w;
  CHECK(world_open(&w, 2));
  member m[2];
  float buf[8] = {0};
  for (int i = 0; i < 2; i++)
    m[i] = (member){.w = &w, .rank = i, .body = waits_or_stops, .n = 8, .ar = buf};
  run_members(m, 2, member_main);
  printf("  member 0: %s\n", m[0].diag.msg);
  CHECK(m[0].err == ZB_ERR_IO && strstr(m[0].diag.msg, "stopped") && strstr(m[0].diag.msg, "peer rank 1") &&
        strstr(m[0].diag.msg, "R s4 mb0"));
  world_close(&w);
}

ZBT_MAIN(ZBT(test_shards_tile_the_buffer), ZBT(test_one_member_moves_nothing), ZBT(test_two_members),
         ZBT(test_three_members), ZBT(test_four_members), ZBT(test_groups_share_transports),
         ZBT(test_a_stage_mismatch_names_both_tags), ZBT(test_an_aborted_member_fails_the_others),
         ZBT(test_bad_arguments_fail_both_members), ZBT(test_the_stop_flag_ends_a_wait))
