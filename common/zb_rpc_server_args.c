/* zb_rpc_server_args.c — how the coordinator's gRPC server is set up:
 * its credentials and its channel arguments, each with why it is set
 * (docs/operations.md, Connections). */
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <string.h>

#include "zb_rpc_internal.h"

/* The server's credentials: TLS asking for a client certificate (checked
 * against the CA when given; handlers decide what a caller without one
 * may do), or plaintext. */
grpc_server_credentials *rpc_server_creds(const zb_tls *tls) {
  if (!tls)
    return grpc_insecure_server_credentials_create();
  grpc_ssl_pem_key_cert_pair pair = {.private_key = tls->key_pem, .cert_chain = tls->cert_pem};
  return grpc_ssl_server_credentials_create_ex(tls->ca_pem, &pair, 1,
                                               GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY, NULL);
}

/* The server's channel arguments into args. */
void rpc_server_args(grpc_arg *args, long long max_message_bytes) {
  grpc_arg all[RPC_SERVER_ARGS] = {
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
       .value.integer = (int)max_message_bytes},
      /* a second coordinator on the same port must fail, not share it */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
      /* a connection that has not finished its HTTP/2 (and TLS) handshake
       * in 10 s is closed, so idle sockets do not hold descriptors for the
       * default 120 s */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, .value.integer = 10000},
      /* a connection with no call for 5 minutes gets a GOAWAY (clients
       * reconnect when they next call); workers keep their Attach open */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_CONNECTION_IDLE_MS, .value.integer = 300000},
      /* calls one connection may have open at once: a client that opens
       * hundreds of streams (watchers that never read) on one connection
       * waits for its own to end instead of holding a call slot each */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_CONCURRENT_STREAMS, .value.integer = ZB_RPC_MAX_STREAMS},
      /* no bandwidth-delay probes: they ping the peer after data arrives,
       * a write and a read more for each small request (a heartbeat);
       * a large message opens the window to its own size anyway */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_BDP_PROBE, .value.integer = 0},
  };
  memcpy(args, all, sizeof all);
}
