/* zb_rpc_arena.c — a bump allocator for unpacked requests
 * (zb_rpc_arena.h). */
#include "zb_rpc_arena.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "zb_alloc.h"

#if defined(__SANITIZE_ADDRESS__)
#define RPC_ARENA_HEAP_ONLY 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RPC_ARENA_HEAP_ONLY 1
#endif
#endif

enum { RPC_ARENA_ALIGN = 16 };

static bool arena_owns(const rpc_arena *a, const void *p) {
  return a->buf && (uintptr_t)p >= (uintptr_t)a->buf && (uintptr_t)p < (uintptr_t)a->buf + a->cap;
}

static void *arena_alloc(void *data, size_t size) {
  rpc_arena *a = data;
  size_t at = (a->used + RPC_ARENA_ALIGN - 1) & ~(size_t)(RPC_ARENA_ALIGN - 1);
  if (at <= a->cap && size <= a->cap - at) {
    a->used = at + size;
    return a->buf + at;
  }
  a->heap_blocks++;
  return zb_malloc(size ? size : 1);
}

static void arena_free(void *data, void *p) {
  rpc_arena *a = data;
  if (p && !arena_owns(a, p))
    free(p);
}

void rpc_arena_init(rpc_arena *a, size_t cap) {
#ifdef RPC_ARENA_HEAP_ONLY
  cap = 0;
#endif
  a->buf = cap ? zb_malloc(cap) : NULL;
  a->cap = cap;
  a->used = a->heap_blocks = 0;
  a->allocator = (ProtobufCAllocator){.alloc = arena_alloc, .free = arena_free, .allocator_data = a};
}

void rpc_arena_destroy(rpc_arena *a) {
  free(a->buf);
  a->buf = NULL;
  a->cap = 0;
}

void rpc_arena_release(rpc_arena *a, ProtobufCMessage *msg) {
  if (msg && a->heap_blocks) /* only the heap's blocks need freeing one by one */
    protobuf_c_message_free_unpacked(msg, &a->allocator);
  a->used = a->heap_blocks = 0;
}
