/* zb_rpc_internal.h — what the client and server halves of the gRPC glue
 * (zb_rpc.c, zb_rpc_server.c) share. Not for other modules. */
#ifndef ZB_RPC_INTERNAL_H
#define ZB_RPC_INTERNAL_H

#include <grpc/byte_buffer.h>

#include "zb_rpc.h"

/* grpc_init, the first time with Abseil's lock-order checks off (a debug
 * aid Debian's Abseil leaves on). */
void rpc_grpc_init(void);
/* A message packed into a new byte buffer (the caller destroys it). */
grpc_byte_buffer *rpc_pack(const ProtobufCMessage *msg);
/* NULL when bb is NULL or does not parse as desc; else the caller frees
 * it (with alloc: protobuf-c's allocator to unpack into, NULL for malloc). */
ProtobufCMessage *rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                             ProtobufCAllocator *alloc);

#endif
