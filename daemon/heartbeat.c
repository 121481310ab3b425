/* heartbeat.c — the heartbeat period asked of workers (heartbeat.h). */
#include <stdbool.h>

#include "heartbeat.h"

int coord_heartbeat_period(int timeout_ms, int attached, int current_ms) {
  long long low = timeout_ms / 5, high = 2LL * timeout_ms / 5;
  long long target = (long long)attached * COORD_HEARTBEAT_MS_PER_WORKER;
  target = target < low ? low : target > high ? high : target;
  long long cur = current_ms;
  bool bound = target == low || target == high;
  bool far = 5 * target > 6 * cur || 6 * target < 5 * cur; /* 20% either way */
  if (cur < low || cur > high || bound || far)
    return (int)target;
  return current_ms;
}
