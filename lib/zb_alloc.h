/* zb_alloc.h — allocation wrappers: failure aborts in one place, so callers
 * never branch on NULL from the allocator. */
#ifndef ZB_ALLOC_H
#define ZB_ALLOC_H

#include <stddef.h>

void *zb_malloc(size_t size);
void *zb_calloc(size_t count, size_t size);
void *zb_realloc(void *ptr, size_t size);
char *zb_strdup(const char *s);

/* Blocks of many megabytes (a plan's lists, a simulation's cells), backed
 * by huge pages where the system allows: a plan at scale otherwise spends
 * more time faulting its memory in 4 KiB at a time than filling it (240 MB
 * on the development VM: 145 ms against 35 ms). Smaller sizes are plain
 * zb_malloc / zb_calloc. Freed with free(). */
void *zb_malloc_large(size_t size);
void *zb_calloc_large(size_t count, size_t size);

/* Writes a zero into every page of p's first size bytes, so that the
 * kernel faults them in now: done on a processor that would otherwise
 * wait, it takes clearing fresh pages off the thread that fills them. */
void zb_prefault(void *p, size_t size);

/* Asks the kernel to fault in the pages of p's first size bytes without
 * writing them (MADV_POPULATE_WRITE, Linux 5.14 and later; elsewhere it
 * does nothing), so that another thread may fill them meanwhile. */
void zb_populate(void *p, size_t size);

#endif
