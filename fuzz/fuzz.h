/* fuzz.h — what every harness shares: libFuzzer's entry point and a check
 * that turns a broken property into a crash, which libFuzzer reports with
 * the input that caused it (a plain assert() would vanish under NDEBUG in
 * the RelWithDebInfo build the harnesses use). */
#ifndef ZB_FUZZ_H
#define ZB_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                                \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond);                            \
      fprintf(stderr, __VA_ARGS__);                                                                          \
      fputc('\n', stderr);                                                                                   \
      abort();                                                                                               \
    }                                                                                                        \
  } while (0)

#endif
