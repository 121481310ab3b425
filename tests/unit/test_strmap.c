/* test_strmap.c — zb_strmap against a plain array doing the same: puts,
 * replacements and removals in a long pseudo-random sequence over few
 * enough keys that runs of probes collide and removals shift entries back;
 * after every step each key's value is what the array says. */
#include <stdint.h>
#include <stdio.h>

#include "zb_strmap.h"
#include "zbtest.h"

enum { KEYS = 300, STEPS = 20000 };

static void test_strmap_basics(void) {
  zb_strmap m = ZB_STRMAP_INIT;
  int a = 1, b = 2;
  CHECK(zb_strmap_get(&m, "w0") == NULL);
  CHECK(zb_strmap_remove(&m, "w0") == NULL);
  zb_strmap_put(&m, "w0", &a);
  zb_strmap_put(&m, "w1", &b);
  CHECK(zb_strmap_get(&m, "w0") == &a);
  CHECK(zb_strmap_get(&m, "w1") == &b);
  CHECK(zb_strmap_get(&m, "w2") == NULL);
  CHECK(zb_strmap_get(&m, "") == NULL);
  char other[] = "w0"; /* an equal key at another address replaces */
  zb_strmap_put(&m, other, &b);
  CHECK_EQ(m.n, 2);
  CHECK(zb_strmap_get(&m, "w0") == &b);
  CHECK(zb_strmap_remove(&m, "w0") == &b);
  CHECK(zb_strmap_get(&m, "w0") == NULL);
  CHECK_EQ(m.n, 1);
  zb_strmap_free(&m);
  CHECK(zb_strmap_get(&m, "w1") == NULL);
}

static uint64_t next_rand(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void test_strmap_against_array(void) {
  static char keys[KEYS][16];
  static int values[KEYS];
  int *want[KEYS] = {0};
  for (int k = 0; k < KEYS; k++)
    snprintf(keys[k], sizeof keys[k], "j-%d", k);
  zb_strmap m = ZB_STRMAP_INIT;
  uint64_t s = 88172645463325252ULL;
  size_t n = 0;
  for (int step = 0; step < STEPS; step++) {
    int k = (int)(next_rand(&s) % KEYS);
    if (next_rand(&s) % 3 == 0) {
      CHECK(zb_strmap_remove(&m, keys[k]) == want[k]);
      n -= want[k] != NULL;
      want[k] = NULL;
    } else {
      values[k] = step;
      n += want[k] == NULL;
      want[k] = &values[k];
      zb_strmap_put(&m, keys[k], want[k]);
    }
    CHECK_EQ(m.n, n);
    CHECK(2 * m.n <= m.cap);
    for (int q = 0; q < KEYS; q++)
      CHECK_MSG(zb_strmap_get(&m, keys[q]) == want[q], "step %d: key %s", step, keys[q]);
  }
  zb_strmap_free(&m);
}

ZBT_MAIN(ZBT(test_strmap_basics), ZBT(test_strmap_against_array))
