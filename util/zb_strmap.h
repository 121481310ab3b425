/* zb_strmap.h — a map from strings to pointers, for lookups by name in
 * constant time on hot paths (the coordinator finds a worker by id on
 * every Report, and a job by id on every rank's Report).
 *
 * The map owns neither keys nor values: a key must stay valid and
 * unchanged while its entry is in the map (the usual key is a field of the
 * value itself, as a worker's id). Open addressing with linear probing,
 * at most half full; a removal shifts the rest of its run back, so no
 * tombstones build up however many entries come and go.
 */
#ifndef ZB_STRMAP_H
#define ZB_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct zb_strmap_entry {
  const char *key; /* NULL: empty slot */
  uint64_t hash;
  void *value;
} zb_strmap_entry;

typedef struct zb_strmap {
  zb_strmap_entry *slots;
  size_t cap; /* 0 or a power of two */
  size_t n;
} zb_strmap;

#define ZB_STRMAP_INIT                                                                                       \
  { NULL, 0, 0 }

/* Frees the slots (not the keys or values); the map is empty again. */
void zb_strmap_free(zb_strmap *m);
/* key -> value, replacing the entry of an equal key (its key pointer too). */
void zb_strmap_put(zb_strmap *m, const char *key, void *value);
/* The value of key, NULL when it has none. */
void *zb_strmap_get(const zb_strmap *m, const char *key);
/* Removes key's entry: its value, NULL when it had none. */
void *zb_strmap_remove(zb_strmap *m, const char *key);

#endif
