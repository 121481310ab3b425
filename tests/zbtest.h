/* zbtest.h — a small test runner: each test is a function; a failed CHECK
 * prints file:line and the expression and ends that test; the runner runs
 * every test (or those named on the command line) and exits non-zero when
 * any failed. */
#ifndef ZBTEST_H
#define ZBTEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct zbt_case {
  const char *name;
  void (*fn)(void);
} zbt_case;

extern int zbt_failed_checks;

#define ZBT_FAIL(...)                                                                                        \
  do {                                                                                                       \
    fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                                                        \
    fprintf(stderr, __VA_ARGS__);                                                                            \
    fputc('\n', stderr);                                                                                     \
    zbt_failed_checks++;                                                                                     \
    return;                                                                                                  \
  } while (0)

#define CHECK(cond)                                                                                          \
  do {                                                                                                       \
    if (!(cond))                                                                                             \
      ZBT_FAIL("CHECK(%s) failed", #cond);                                                                   \
  } while (0)

#define CHECK_MSG(cond, ...)                                                                                 \
  do {                                                                                                       \
    if (!(cond))                                                                                             \
      ZBT_FAIL(__VA_ARGS__);                                                                                 \
  } while (0)

#define CHECK_EQ(a, b)                                                                                       \
  do {                                                                                                       \
    long long zbt_a_ = (long long)(a), zbt_b_ = (long long)(b);                                              \
    if (zbt_a_ != zbt_b_)                                                                                    \
      ZBT_FAIL("CHECK_EQ(%s, %s): %lld != %lld", #a, #b, zbt_a_, zbt_b_);                                    \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                                                                \
  do {                                                                                                       \
    double zbt_a_ = (double)(a), zbt_b_ = (double)(b);                                                       \
    if (!(fabs(zbt_a_ - zbt_b_) <= (tol)))                                                                   \
      ZBT_FAIL("CHECK_NEAR(%s, %s, %s): %.12g vs %.12g", #a, #b, #tol, zbt_a_, zbt_b_);                      \
  } while (0)

#define CHECK_STREQ(a, b)                                                                                    \
  do {                                                                                                       \
    const char *zbt_a_ = (a), *zbt_b_ = (b);                                                                 \
    if (strcmp(zbt_a_, zbt_b_) != 0)                                                                         \
      ZBT_FAIL("CHECK_STREQ(%s, %s): \"%s\" != \"%s\"", #a, #b, zbt_a_, zbt_b_);                             \
  } while (0)

/* Runs cases; argv names select tests. Returns the process exit code. */
int zbt_run(const zbt_case *cases, int n, int argc, char **argv);

/* ||a - b||_2 in double (b NULL: ||a||_2), for relative errors of fp32
 * tensors. */
static inline double zbt_norm2(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (b ? (double)b[i] : 0.0);
    s += d * d;
  }
  return sqrt(s);
}

/* splitmix64's finalizer: the tests' deterministic hash. */
static inline uint64_t zbt_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/* A value in [-1, 1) from (key, i), the same on every machine. */
static inline float zbt_urand(uint64_t key, uint64_t i) {
  return (float)((double)(zbt_mix64(key ^ zbt_mix64(i)) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* Removes dir and the plain files in it (a test's temporary directory);
 * a failure to remove counts as a failed check. */
void zbt_remove_dir(const char *dir);

#define ZBT_MAIN(...)                                                                                        \
  int zbt_failed_checks;                                                                                     \
  int main(int argc, char **argv) {                                                                          \
    static const zbt_case cases[] = {__VA_ARGS__};                                                           \
    return zbt_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);                                \
  }
#define ZBT(fn)                                                                                              \
  { #fn, fn }

#endif
