/* strmap.c — zb_strmap (zb_strmap.h): strings to pointers, open
 * addressing with linear probing and backward-shift removal. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_strmap.h"

/* FNV-1a, 64 bits. */
static uint64_t strmap_hash(const char *s) {
  uint64_t h = 14695981039346656037ULL;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

/* The slot holding key, or the empty slot where it would go (cap > 0). */
static size_t strmap_find(const zb_strmap *m, const char *key, uint64_t hash) {
  size_t mask = m->cap - 1;
  size_t i = (size_t)hash & mask;
  while (m->slots[i].key && (m->slots[i].hash != hash || strcmp(m->slots[i].key, key) != 0))
    i = (i + 1) & mask;
  return i;
}

static void strmap_grow(zb_strmap *m) {
  zb_strmap old = *m;
  m->cap = old.cap ? 2 * old.cap : 16;
  m->slots = zb_calloc(m->cap, sizeof *m->slots);
  for (size_t k = 0; k < old.cap; k++)
    if (old.slots[k].key)
      m->slots[strmap_find(m, old.slots[k].key, old.slots[k].hash)] = old.slots[k];
  free(old.slots);
}

void zb_strmap_free(zb_strmap *m) {
  free(m->slots);
  *m = (zb_strmap)ZB_STRMAP_INIT;
}

void zb_strmap_put(zb_strmap *m, const char *key, void *value) {
  if (2 * (m->n + 1) > m->cap)
    strmap_grow(m);
  uint64_t hash = strmap_hash(key);
  size_t i = strmap_find(m, key, hash);
  if (!m->slots[i].key)
    m->n++;
  m->slots[i] = (zb_strmap_entry){key, hash, value};
}

void *zb_strmap_get(const zb_strmap *m, const char *key) {
  if (m->n == 0)
    return NULL;
  size_t i = strmap_find(m, key, strmap_hash(key));
  return m->slots[i].key ? m->slots[i].value : NULL;
}

/* Whether slot `at` lies on the cyclic way from `home` to `to`. */
static bool strmap_between(size_t home, size_t at, size_t to, size_t mask) {
  return ((at - home) & mask) < ((to - home) & mask);
}

void *zb_strmap_remove(zb_strmap *m, const char *key) {
  if (m->n == 0)
    return NULL;
  size_t mask = m->cap - 1;
  size_t hole = strmap_find(m, key, strmap_hash(key));
  if (!m->slots[hole].key)
    return NULL;
  void *value = m->slots[hole].value;
  /* every later entry of the run that may move back into the hole does:
   * one whose home is not between the hole and where it sits */
  for (size_t j = (hole + 1) & mask; m->slots[j].key; j = (j + 1) & mask) {
    size_t home = (size_t)m->slots[j].hash & mask;
    if (strmap_between(home, hole, j, mask)) {
      m->slots[hole] = m->slots[j];
      hole = j;
    }
  }
  m->slots[hole] = (zb_strmap_entry){0};
  m->n--;
  return value;
}
