/* zb_alloc.h — allocation wrappers: failure aborts in one place, so callers
 * never branch on NULL from the allocator. */
#ifndef ZB_ALLOC_H
#define ZB_ALLOC_H

#include <stddef.h>

void *zb_malloc(size_t size);
void *zb_calloc(size_t count, size_t size);
void *zb_realloc(void *ptr, size_t size);
char *zb_strdup(const char *s);

#endif
