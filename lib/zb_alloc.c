/* madvise and its MADV_HUGEPAGE, beyond the POSIX the build asks for */
#define _DEFAULT_SOURCE

#include "zb_alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

/* Transparent huge pages are 2 MiB on x86-64 and most arm64 kernels; a
 * block below a few of them gains too little to round up to one. */
#define ZB_HUGE_PAGE ((size_t)2 << 20)
#define ZB_LARGE_MIN (4 * ZB_HUGE_PAGE)

void *zb_malloc_large(size_t size) {
#ifdef MADV_HUGEPAGE
  if (size >= ZB_LARGE_MIN && size <= SIZE_MAX - ZB_HUGE_PAGE) {
    size_t whole = (size + ZB_HUGE_PAGE - 1) & ~(ZB_HUGE_PAGE - 1);
    void *p = zb_alloc_check(aligned_alloc(ZB_HUGE_PAGE, whole), whole);
    (void)madvise(p, whole, MADV_HUGEPAGE); /* a hint: refused, the pages are 4 KiB ones */
    return p;
  }
#endif
  return zb_malloc(size);
}

void *zb_calloc_large(size_t count, size_t size) {
  if (size && count > SIZE_MAX / size)
    abort(); /* as calloc's own overflow would, through zb_alloc_check */
  if (count * size < ZB_LARGE_MIN)
    return zb_calloc(count, size);
  void *p = zb_malloc_large(count * size);
  return memset(p, 0, count * size);
}

/* The smallest page the kernel may fault in on its own. */
#define ZB_SMALL_PAGE ((size_t)4096)

void zb_prefault(void *p, size_t size) {
  volatile char *c = p; /* each store must happen: no reader follows */
  for (size_t at = 0; at < size; at += ZB_SMALL_PAGE)
    c[at] = 0;
}

void zb_populate(void *p, size_t size) {
#ifdef MADV_POPULATE_WRITE
  uintptr_t first = ((uintptr_t)p + ZB_SMALL_PAGE - 1) & ~(uintptr_t)(ZB_SMALL_PAGE - 1); /* madvise's unit */
  uintptr_t end = (uintptr_t)p + size;
  if (end > first)
    (void)madvise((void *)first, end - first, MADV_POPULATE_WRITE); /* a hint: refused, the run faults */
#else
  (void)p;
  (void)size;
#endif
}
