/* test_zbpy_plan — the Python package's planning half (python/src/
 * zbpy_plan.c) in C, so that it runs under ASan + UBSan too: zbctl's
 * steps and messages, zb-auto's search naming its choice, per-stage times
 * used, and every plan and failure freed (LeakSanitizer checks that). The
 * bytes against zbctl are python/tests/test_plan.py's. */
#include <string.h>

#include "zb_format.h"
#include "zbpy_plan.h"
#include "zbtest.h"

static zbpy_request request(const char *schedule, int p, int m) {
  return (zbpy_request){.schedule = schedule, .p = p, .m = m, .rank = zb_rank_costs_default()};
}

/* A failed run: its error and its message, the plan freed. */
static void check_refused(const zbpy_request *req, zb_err want, const char *msg) {
  zbpy_plan pl;
  zb_diag d = {{0}};
  zb_err err = zbpy_plan_run(req, &pl, &d);
  CHECK_MSG(err == want, "%s: error %d, want %d (%s)", req->schedule, err, want, d.msg);
  CHECK_MSG(strstr(d.msg, msg) != NULL, "message '%s' lacks '%s'", d.msg, msg);
  zbpy_plan_free(&pl);
}

static void test_refusals(void) {
  zbpy_request r = request("zb-x", 4, 8);
  check_refused(&r, ZB_ERR_INVALID_ARG, "unknown schedule 'zb-x'");
  r = request("zb-v", 4, 8);
  r.v = 3;
  check_refused(&r, ZB_ERR_UNSUPPORTED, "zb-v places exactly 2 chunks per rank");
  r = request("1f1b", 4, 8);
  r.have_objective = true;
  check_refused(&r, ZB_ERR_INVALID_ARG, "objective applies to zb-auto only");
  r = request("1f1b", 4, 8);
  r.rank.m_f = 0;
  check_refused(&r, ZB_ERR_INVALID_ARG, "mem needs M_F > 0");
  r = request("1f1b", 4, 8);
  r.rank.t_b = -1;
  check_refused(&r, ZB_ERR_INVALID_ARG, "costs/mem: T_B of stage 0");
  r = request("1f1b", 4, 8);
  r.limit_units = 2;
  check_refused(&r, ZB_ERR_INVALID_SCHEDULE, "exceeds the limit 2");
  r = request("zb-auto", 4, 8);
  r.limit_units = 0.1;
  check_refused(&r, ZB_ERR_INFEASIBLE, "no schedule of any placement fits");
  const double rows[3][3] = {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}};
  r = request("zb-h1", 4, 8);
  r.stage_times = rows;
  r.n_stage_times = 3;
  check_refused(&r, ZB_ERR_INVALID_ARG, "stage_costs has 3 rows, the schedule has 4 stages");
}

/* zb-auto without chunks searches and names its choice in the report. */
static void test_search_named(void) {
  zbpy_request r = request("zb-auto", 4, 8);
  r.limit_units = 8;
  zbpy_plan pl;
  zb_diag d;
  CHECK_EQ(zbpy_plan_run(&r, &pl, &d), ZB_OK);
  CHECK(pl.searched && pl.costs == NULL && pl.result.compute && pl.result.lowered);
  CHECK_MSG(strncmp(pl.name, "zb-auto (chose ", 15) == 0, "name '%s'", pl.name);
  zb_buf b = ZB_BUF_INIT;
  zbpy_plan_json(&pl, &b);
  CHECK(strstr(b.data, "\"schedule\": \"zb-auto (chose ") != NULL);
  CHECK(strstr(b.data, "\"mem_limit\": 8,") != NULL);
  zb_buf_free(&b);
  zbpy_plan_free(&pl);
}

/* Per-stage times replace the times: a slow last stage lengthens the
 * plan, and the report's costs leave out the rank's share. */
static void test_stage_times(void) {
  double rows[4][3] = {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}};
  zbpy_request r = request("1f1b", 4, 8);
  r.stage_times = (const double(*)[3])rows;
  r.n_stage_times = 4;
  zbpy_plan even, slow;
  zb_diag d;
  CHECK_EQ(zbpy_plan_run(&r, &even, &d), ZB_OK);
  rows[3][0] = 3;
  CHECK_EQ(zbpy_plan_run(&r, &slow, &d), ZB_OK);
  CHECK(slow.result.sim->makespan > even.result.sim->makespan);
  zb_buf b = ZB_BUF_INIT;
  zbpy_plan_json(&slow, &b);
  CHECK(strstr(b.data, "\"costs\": {\"t_comm\": 0}") != NULL);
  zb_buf_free(&b);
  zbpy_plan_free(&even);
  zbpy_plan_free(&slow);
}

/* zbpy_plan_free on a zeroed plan is harmless; after a plan it clears the costs. */
static void test_free_zeroed(void) {
  zbpy_plan pl;
  memset(&pl, 0, sizeof pl);
  zbpy_plan_free(&pl);
  zbpy_request r = request("zb-v", 2, 4);
  zb_diag d;
  CHECK_EQ(zbpy_plan_run(&r, &pl, &d), ZB_OK);
  CHECK_EQ(pl.result.v, 2);
  zbpy_plan_free(&pl);
  CHECK(pl.costs == NULL);
}

ZBT_MAIN(ZBT(test_refusals), ZBT(test_search_named), ZBT(test_stage_times), ZBT(test_free_zeroed))
