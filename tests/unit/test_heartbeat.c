/* test_heartbeat.c — the heartbeat period the coordinator asks of its
 * workers (daemon/heartbeat.c): a fifth of the timeout for a few workers,
 * 5 ms per worker between the bounds, two fifths of the timeout for many;
 * it moves only past 20% between the bounds, and always to a bound. */
#include "heartbeat.h"
#include "zbtest.h"

static void test_heartbeat_bounds(void) {
  CHECK_EQ(coord_heartbeat_period(5000, 0, 0), 1000);
  CHECK_EQ(coord_heartbeat_period(5000, 1, 0), 1000);
  CHECK_EQ(coord_heartbeat_period(5000, 200, 0), 1000);
  CHECK_EQ(coord_heartbeat_period(5000, 300, 0), 1500);
  CHECK_EQ(coord_heartbeat_period(5000, 399, 0), 1995);
  CHECK_EQ(coord_heartbeat_period(5000, 1000, 0), 2000);
  CHECK_EQ(coord_heartbeat_period(5000, 1000000, 0), 2000);
  CHECK_EQ(coord_heartbeat_period(1500, 4, 0), 300);
  CHECK_EQ(coord_heartbeat_period(1500, 150, 0), 600);
  CHECK_EQ(coord_heartbeat_period(100, 1, 0), 20); /* the smallest timeout */
  CHECK_EQ(coord_heartbeat_period(600000, 1000000, 0), 240000);
}

static void test_heartbeat_hysteresis(void) {
  /* 1000 ms asked; 1150 is within 20%: kept; 1250 is not */
  CHECK_EQ(coord_heartbeat_period(5000, 230, 1000), 1000);
  CHECK_EQ(coord_heartbeat_period(5000, 250, 1000), 1250);
  /* from 1500, falling: 1300 is within 20%, 1200 is past it */
  CHECK_EQ(coord_heartbeat_period(5000, 260, 1500), 1500);
  CHECK_EQ(coord_heartbeat_period(5000, 240, 1500), 1200);
  /* the bounds are always reached, however close */
  CHECK_EQ(coord_heartbeat_period(5000, 400, 1900), 2000);
  CHECK_EQ(coord_heartbeat_period(5000, 100, 1100), 1000);
  /* a new timeout (SIGHUP) that leaves the period asked out of bounds */
  CHECK_EQ(coord_heartbeat_period(3000, 250, 1250), 1200);
  CHECK_EQ(coord_heartbeat_period(10000, 250, 1250), 2000);
}

/* Workers attaching one at a time from 1 to 1000 and leaving again: the
 * period asked changes a few times, never by a worker's step each time. */
static void test_heartbeat_ramp_changes_rarely(void) {
  int period = 0, changes = 0;
  for (int n = 1; n <= 1000; n++) {
    int next = coord_heartbeat_period(5000, n, period);
    changes += next != period;
    CHECK(next >= 1000 && next <= 2000);
    period = next;
  }
  CHECK_EQ(period, 2000);
  CHECK(changes <= 5);
  for (int n = 1000; n >= 1; n--) {
    int next = coord_heartbeat_period(5000, n, period);
    changes += next != period;
    period = next;
  }
  CHECK_EQ(period, 1000);
  CHECK(changes <= 10);
}

ZBT_MAIN(ZBT(test_heartbeat_bounds), ZBT(test_heartbeat_hysteresis), ZBT(test_heartbeat_ramp_changes_rarely))
