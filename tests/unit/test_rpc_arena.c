/* test_rpc_arena.c — the arena the coordinator unpacks requests into
 * (common/zb_rpc_arena.c): a Report unpacked through it has every field
 * it was packed with, whether it fits the arena or spills to the heap;
 * after a release the next request reuses the same bytes. Under
 * AddressSanitizer the arena has no bytes of its own (all from the heap),
 * and the same checks hold. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "zb/v1/zb.pb-c.h"
#include "zb_rpc_arena.h"
#include "zbtest.h"

/* A Report with an error text of n bytes, packed into a new buffer. */
static uint8_t *packed_report(size_t n, size_t *len) {
  char *error = malloc(n + 1);
  memset(error, 'e', n);
  error[n] = 0;
  Zb__V1__ReportRequest req = ZB__V1__REPORT_REQUEST__INIT;
  req.worker_id = "w7";
  req.job_id = "j-12";
  req.rank = 3;
  req.iteration = 41;
  req.error = error;
  req.sent_seconds = 12.5;
  *len = zb__v1__report_request__get_packed_size(&req);
  uint8_t *buf = malloc(*len);
  zb__v1__report_request__pack(&req, buf);
  free(error);
  return buf;
}

static bool report_matches(const Zb__V1__ReportRequest *r, size_t n) {
  if (!r || strcmp(r->worker_id, "w7") || strcmp(r->job_id, "j-12") || r->rank != 3 || r->iteration != 41 ||
      r->sent_seconds != 12.5 || strlen(r->error) != n)
    return false;
  for (size_t k = 0; k < n; k++)
    if (r->error[k] != 'e')
      return false;
  return true;
}

static void test_arena_fits_and_spills(void) {
  rpc_arena a;
  rpc_arena_init(&a, 1024);
  static const size_t sizes[] = {10, 5000, 20, 100000, 0};
  const void *first_small = NULL;
  for (int round = 0; round < 3; round++)
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      size_t len;
      uint8_t *buf = packed_report(sizes[k], &len);
      Zb__V1__ReportRequest *r = zb__v1__report_request__unpack(&a.allocator, len, buf);
      free(buf);
      CHECK_MSG(report_matches(r, sizes[k]), "round %d, an error of %zu bytes", round, sizes[k]);
      if (a.cap) { /* not under AddressSanitizer */
        CHECK_EQ(a.heap_blocks > 0, sizes[k] > 1024);
        if (sizes[k] == 10 && !first_small)
          first_small = r;
        if (sizes[k] == 10) /* released before: the same bytes again */
          CHECK(r == first_small);
      }
      rpc_arena_release(&a, &r->base);
      CHECK_EQ(a.used, 0);
      CHECK_EQ(a.heap_blocks, 0);
    }
  rpc_arena_destroy(&a);
}

static void test_arena_bad_input(void) {
  rpc_arena a;
  rpc_arena_init(&a, 256);
  size_t len;
  uint8_t *buf = packed_report(2000, &len);
  /* cut short: protobuf-c refuses it and frees what it had taken */
  CHECK(zb__v1__report_request__unpack(&a.allocator, len - 7, buf) == NULL);
  rpc_arena_release(&a, NULL);
  CHECK_EQ(a.used, 0);
  Zb__V1__ReportRequest *r = zb__v1__report_request__unpack(&a.allocator, len, buf);
  CHECK(report_matches(r, 2000));
  rpc_arena_release(&a, &r->base);
  free(buf);
  rpc_arena_destroy(&a);
}

ZBT_MAIN(ZBT(test_arena_fits_and_spills), ZBT(test_arena_bad_input))
