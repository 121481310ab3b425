#include "zb_alloc.h"

#include <stdlib.h>
#include <string.h>

/* libzb has no I/O, so an allocation failure cannot be reported here; it
 * aborts, which every caller (daemon, client, tests) treats as fatal anyway. */
static void *zb_alloc_check(void *p, size_t size) {
  if (!p && size)
    abort();
  return p;
}

void *zb_malloc(size_t size) {
  return zb_alloc_check(malloc(size), size);
}
void *zb_calloc(size_t count, size_t size) {
  return zb_alloc_check(calloc(count, size), count * size);
}
void *zb_realloc(void *ptr, size_t size) {
  return zb_alloc_check(realloc(ptr, size), size);
}
char *zb_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = zb_malloc(n);
  memcpy(d, s, n);
  return d;
}
