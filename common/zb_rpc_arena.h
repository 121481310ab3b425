/* zb_rpc_arena.h — the memory the server unpacks requests into: one
 * buffer, reused for every request (a handler's request lives until the
 * handler returns, zb_rpc.h), so a Report costs protobuf-c no malloc and
 * no free. What does not fit comes from the heap and goes back to it.
 * Under AddressSanitizer everything comes from the heap, so a handler that
 * keeps a pointer into its request past its return is still caught.
 * Private to the gRPC glue (zb_rpc_server.c). */
#ifndef ZB_RPC_ARENA_H
#define ZB_RPC_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

typedef struct rpc_arena {
  ProtobufCAllocator allocator; /* hands out this arena's memory */
  unsigned char *buf;
  size_t cap, used;
  size_t heap_blocks; /* blocks that did not fit: from malloc, freed one by one */
} rpc_arena;

/* An arena of cap bytes (allocated here). */
void rpc_arena_init(rpc_arena *a, size_t cap);
void rpc_arena_destroy(rpc_arena *a);
/* Frees msg (unpacked with a->allocator; may be NULL) and makes the whole
 * arena free again. */
void rpc_arena_release(rpc_arena *a, ProtobufCMessage *msg);

#endif
