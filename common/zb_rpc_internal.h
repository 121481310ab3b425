/* zb_rpc_internal.h — what the client and server halves of the gRPC glue
 * (zb_rpc.c, zb_rpc_server.c, zb_rpc_server_args.c, zb_rpc_identity.c)
 * share. Not for other modules. */
#ifndef ZB_RPC_INTERNAL_H
#define ZB_RPC_INTERNAL_H

#include <grpc/byte_buffer.h>
#include <grpc/grpc_security.h>

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
/* rpc_unpack, refusing (NULL) a message with a NUL byte in a string
 * field, whose dotted name goes to nul_field (empty when none). */
ProtobufCMessage *rpc_unpack_strict(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                    ProtobufCAllocator *alloc, char *nul_field, size_t cap);
/* zb_rpc_identity.c: the peer of a server call (zb_rpc_call_identity);
 * secure: the server serves TLS. */
void rpc_identity_of_call(grpc_call *call, bool secure, zb_identity *out);

/* zb_rpc_server_args.c: the server's credentials (TLS asking for a
 * client certificate, or plaintext when tls is NULL) and its
 * RPC_SERVER_ARGS channel arguments into args. */
enum { RPC_SERVER_ARGS = 6 };
grpc_server_credentials *rpc_server_creds(const zb_tls *tls);
void rpc_server_args(grpc_arg *args, long long max_message_bytes);

#endif
