/* test_nccl_id.c — the worker's side of the NCCL id exchange
 * (worker/nccl_id.c; docs/wire.md, NCCL id exchange), built from the
 * worker's own sources: the main thread's worker_take_nccl_id hands an id
 * to a job thread waiting in worker_nccl_exchange, only for the job it
 * names; the wait ends on the id, on the stop flag and on its timeout,
 * each with its message; rank 0's report to a coordinator that is not
 * there fails naming the step. The coordinator's half is
 * tests/service/test_gpu_workers.py. */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "worker.h"
#include "zb_clock.h"
#include "zbtest.h"

static void worker_init(worker *w) {
  memset(w, 0, sizeof *w);
  snprintf(w->id, sizeof w->id, "w-test");
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
}

static void worker_fini(worker *w) {
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
}

static zb_assignment rank_of(const char *job, int rank) {
  zb_assignment a;
  memset(&a, 0, sizeof a);
  snprintf(a.job_id, sizeof a.job_id, "%s", job);
  a.rank = rank;
  a.ranks = 4;
  a.plan_version = 1;
  snprintf(a.transport, sizeof a.transport, "nccl");
  return a;
}

/* What the main thread does, after a delay: Command.nccl_id arrivals. */
typedef struct sender {
  worker *w;
  int delay_ms;
  const char *job;
  size_t len;
  uint8_t byte;
  atomic_bool *stop_instead; /* set this flag instead of sending */
} sender;

static void *send_later(void *arg) {
  sender *s = arg;
  struct timespec ts = {s->delay_ms / 1000, (long)(s->delay_ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  if (s->stop_instead) {
    atomic_store(s->stop_instead, true);
    return NULL;
  }
  uint8_t id[ZB_NCCL_ID_BYTES + 8];
  memset(id, s->byte, sizeof id);
  Zb__V1__NcclId pb = ZB__V1__NCCL_ID__INIT;
  pb.job_id = (char *)s->job;
  pb.unique_id.data = id;
  pb.unique_id.len = s->len;
  worker_take_nccl_id(s->w, &pb);
  return NULL;
}

/* An id for the running job reaches a rank waiting for it. */
static void test_id_reaches_the_waiting_rank(void) {
  worker w;
  worker_init(&w);
  snprintf(w.running_job, sizeof w.running_job, "j-7");
  zb_assignment a = rank_of("j-7", 2);
  sender s = {.w = &w, .delay_ms = 100, .job = "j-7", .len = ZB_NCCL_ID_BYTES, .byte = 0xab};
  pthread_t t;
  pthread_create(&t, NULL, send_later, &s);
  uint8_t out[ZB_NCCL_ID_BYTES];
  memset(out, 0, sizeof out);
  atomic_bool stop = false;
  zb_diag d = {{0}};
  double t0 = zb_clock_s();
  zb_err err = worker_nccl_exchange(&w, &a, NULL, out, 10, &stop, &d);
  pthread_join(t, NULL);
  CHECK_MSG(err == ZB_OK, "%s", d.msg);
  CHECK(zb_clock_s() - t0 < 5); /* woken by the id, not by the timeout */
  CHECK_EQ(out[0], 0xab);
  CHECK_EQ(out[ZB_NCCL_ID_BYTES - 1], 0xab);
  /* an id that arrived before the wait is there at once (the next job's too) */
  snprintf(w.running_job, sizeof w.running_job, "j-8");
  zb_assignment next = rank_of("j-9", 1);
  w.next_job = &next;
  sender s2 = {.w = &w, .delay_ms = 0, .job = "j-9", .len = ZB_NCCL_ID_BYTES, .byte = 0x11};
  send_later(&s2);
  w.next_job = NULL;
  CHECK_EQ(worker_nccl_exchange(&w, &next, NULL, out, 1, &stop, &d), ZB_OK);
  CHECK_EQ(out[5], 0x11);
  worker_fini(&w);
}

/* An id for another job, or of the wrong length, is not taken: the wait
 * times out and says so. */
static void test_other_jobs_ids_are_ignored(void) {
  worker w;
  worker_init(&w);
  snprintf(w.running_job, sizeof w.running_job, "j-1");
  sender other = {.w = &w, .job = "j-2", .len = ZB_NCCL_ID_BYTES, .byte = 1};
  send_later(&other);
  sender shortid = {.w = &w, .job = "j-1", .len = ZB_NCCL_ID_BYTES - 1, .byte = 2};
  send_later(&shortid);
  sender longid = {.w = &w, .job = "j-1", .len = ZB_NCCL_ID_BYTES + 1, .byte = 3};
  send_later(&longid);
  zb_assignment a = rank_of("j-1", 3);
  uint8_t out[ZB_NCCL_ID_BYTES];
  atomic_bool stop = false;
  zb_diag d = {{0}};
  double t0 = zb_clock_s();
  CHECK_EQ(worker_nccl_exchange(&w, &a, NULL, out, 0.3, &stop, &d), ZB_ERR_IO);
  double took = zb_clock_s() - t0;
  CHECK_MSG(took >= 0.29 && took < 5, "waited %.3f s", took);
  CHECK_MSG(strstr(d.msg, "j-1") && strstr(d.msg, "rank 3") && strstr(d.msg, "no NCCL id") &&
                strstr(d.msg, "0.3 s"),
            "%s", d.msg);
  worker_fini(&w);
}

/* The job's stop flag ends the wait well before its timeout. */
static void test_stop_ends_the_wait(void) {
  worker w;
  worker_init(&w);
  snprintf(w.running_job, sizeof w.running_job, "j-3");
  atomic_bool stop = false;
  sender s = {.w = &w, .delay_ms = 100, .stop_instead = &stop};
  pthread_t t;
  pthread_create(&t, NULL, send_later, &s);
  zb_assignment a = rank_of("j-3", 1);
  uint8_t out[ZB_NCCL_ID_BYTES];
  zb_diag d = {{0}};
  double t0 = zb_clock_s();
  zb_err err = worker_nccl_exchange(&w, &a, NULL, out, 30, &stop, &d);
  pthread_join(t, NULL);
  CHECK_EQ(err, ZB_ERR_IO);
  CHECK(zb_clock_s() - t0 < 5);
  CHECK_MSG(strstr(d.msg, "stopped while waiting for the NCCL id"), "%s", d.msg);
  worker_fini(&w);
}

/* Rank 0 and only rank 0 brings its own id; its report to a coordinator
 * that is not there fails naming the step. */
static void test_rank0_reports(void) {
  worker w;
  worker_init(&w);
  uint8_t mine[ZB_NCCL_ID_BYTES], out[ZB_NCCL_ID_BYTES];
  memset(mine, 7, sizeof mine);
  atomic_bool stop = false;
  zb_diag d = {{0}};
  zb_assignment r0 = rank_of("j-4", 0), r1 = rank_of("j-4", 1);
  CHECK_EQ(worker_nccl_exchange(&w, &r0, NULL, out, 1, &stop, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "rank 0 must make the NCCL id"), "%s", d.msg);
  CHECK_EQ(worker_nccl_exchange(&w, &r1, mine, out, 1, &stop, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "only rank 0"), "%s", d.msg);
  CHECK_EQ(worker_nccl_exchange(&w, &r1, NULL, out, 0, &stop, &d), ZB_ERR_INVALID_ARG);
  /* port 1 on loopback: nothing listens */
  w.rpc = zb_rpc_client_new("127.0.0.1:1", 1 << 20);
  double t0 = zb_clock_s();
  CHECK_EQ(worker_nccl_exchange(&w, &r0, mine, out, 1, &stop, &d), ZB_ERR_IO);
  CHECK(zb_clock_s() - t0 < 15);
  CHECK_MSG(strstr(d.msg, "j-4") && strstr(d.msg, "reporting the NCCL id to the coordinator failed"), "%s",
            d.msg);
  zb_rpc_client_free(w.rpc);
  worker_fini(&w);
}

ZBT_MAIN(ZBT(test_id_reaches_the_waiting_rank), ZBT(test_other_jobs_ids_are_ignored),
         ZBT(test_stop_ends_the_wait), ZBT(test_rank0_reports))
