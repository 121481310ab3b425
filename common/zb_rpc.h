/* zb_rpc.h — gRPC C core with protobuf-c messages, for zb's daemons and
 * zbctl (docs/architecture.md, Threads; docs/wire.md, Protocol).
 *
 * Server: one completion-queue thread hands every event to the owner's
 * libuv loop, many per wake-up (zb_rpc_handoff.h); all gRPC calls and
 * every handler run on that loop thread, so handlers touch daemon state
 * without locks. Methods are a table (path, request type, handler);
 * requests arrive unpacked; a request that does not parse is answered
 * INVALID_ARGUMENT before any handler sees it; unknown methods get
 * UNIMPLEMENTED.
 *
 * Client: blocking calls, each on its own completion queue, so several
 * threads can call at once (a worker's control thread and its executor).
 *
 * Ownership: a zb_rpc_call belongs to the server; a handler may keep the
 * pointer until it ends the call (reply, fail, stream_finish) or its
 * on_close callback ran. Messages handed to reply/write are packed at once
 * and stay the caller's. Messages returned by client calls are the
 * caller's (free with protobuf_c_message_free_unpacked(msg, NULL)).
 */
#ifndef ZB_RPC_H
#define ZB_RPC_H

#include <grpc/grpc.h>
#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "zb_err.h"
#include "zb_tls.h"

typedef struct zb_rpc_server zb_rpc_server;
typedef struct zb_rpc_call zb_rpc_call;

/* A handler gets the unpacked request (freed by the server after the
 * handler returns: copy what you keep) and the server's user pointer. */
typedef void (*zb_rpc_handler)(zb_rpc_call *call, const ProtobufCMessage *request, void *user);

typedef struct zb_rpc_method {
  const char *path; /* "/zb.v1.Zb/SubmitJob" */
  const ProtobufCMessageDescriptor *request;
  zb_rpc_handler handler;
  /* Server streaming: the server watches for the peer leaving from the
   * start (zb_rpc_call_on_close). A unary handler must end its call before
   * it returns; that saves a completion event per call. */
  bool streaming;
  /* Unary, answered later: the handler may return with the call open and
   * end it from the loop afterwards (work done off the loop, such as
   * planning); the server watches for the peer leaving, as for a stream. */
  bool deferred;
} zb_rpc_method;

/* Calls one client connection may have open at once (HTTP/2's
 * SETTINGS_MAX_CONCURRENT_STREAMS): past it a client's further calls wait
 * on its side for one of its own to end. */
enum { ZB_RPC_MAX_STREAMS = 100 };
/* Binds addr ("host:port"; port 0: any free port, written to *bound_port),
 * registers the methods (the table must outlive the server), starts the
 * completion-queue thread and attaches to loop. max_message_bytes bounds
 * requests. tls: serve TLS with tls's certificate and ask every client
 * for one signed by its CA (a client without one still connects and gets
 * role NONE; zb_rpc_call_identity); NULL: plaintext. Does not block. */
zb_err zb_rpc_server_start(uv_loop_t *loop, const char *addr, long long max_message_bytes,
                           const zb_rpc_method *methods, int n_methods, void *user, const zb_tls *tls,
                           zb_rpc_server **out, int *bound_port, zb_diag *diag);
/* Stops accepting calls, cancels the live ones (their on_close callbacks
 * run), joins the thread and frees everything; `done` runs on the loop
 * when all is gone (the loop must keep running until then). */
void zb_rpc_server_shutdown(zb_rpc_server *srv, void (*done)(void *arg), void *arg);

/* Unary: answers msg with status OK and ends the call. */
void zb_rpc_reply(zb_rpc_call *call, const ProtobufCMessage *msg);
/* An answer packed ahead, on any thread (a large one built off the loop),
 * then sent from the loop: zb_rpc_reply_packed takes the buffer. */
grpc_byte_buffer *zb_rpc_pack(const ProtobufCMessage *msg);
void zb_rpc_reply_packed(zb_rpc_call *call, grpc_byte_buffer *packed);
/* Ends the call with a non-OK status and a message (printf-style). */
void zb_rpc_fail(zb_rpc_call *call, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Server streaming: queues one message (sent in order, one in flight). */
void zb_rpc_stream_write(zb_rpc_call *call, const ProtobufCMessage *msg);
/* The same for a message packed ahead (zb_rpc_pack; stays the caller's,
 * its bytes shared, not copied: one event packed once for every watcher),
 * with the caller's tag (>= 0; say, the message's sequence number), which
 * zb_rpc_stream_sent_tag gives back once it is handed to gRPC. */
void zb_rpc_stream_write_packed(zb_rpc_call *call, const grpc_byte_buffer *packed, int64_t tag);
/* The tag of the last message handed to gRPC on the stream, which reaches
 * the peer before any status does (zb_rpc_fail drops only those queued
 * behind it); -1 when none was, or it had no tag. */
int64_t zb_rpc_stream_sent_tag(const zb_rpc_call *call);
/* Ends a stream once the queued messages are sent. */
void zb_rpc_stream_finish(zb_rpc_call *call, grpc_status_code code, const char *details);
/* Runs cb on the loop when the peer goes away (cancel, deadline, broken
 * connection, server shutdown) before the call was ended by us. After cb
 * the call pointer must not be used. */
void zb_rpc_call_on_close(zb_rpc_call *call, void (*cb)(zb_rpc_call *call, void *arg), void *arg);
/* Runs cb on the loop each time a stream's queue of messages has been
 * sent out (the peer is reading): for pacing a long stream from a store
 * instead of queueing all of it. NULL cb: none. */
void zb_rpc_call_on_drain(zb_rpc_call *call, void (*cb)(zb_rpc_call *call, void *arg), void *arg);
/* The caller: the zb://ROLE/NAME of its client certificate, role NONE
 * without one; on a plaintext server an admin named "insecure". */
void zb_rpc_call_identity(const zb_rpc_call *call, zb_identity *out);
/* The peer's address ("ipv4:127.0.0.1:5555"); valid while the call is. */
const char *zb_rpc_call_peer(zb_rpc_call *call);
/* Messages queued but not yet sent on a stream (back-pressure check). */
int zb_rpc_call_queued(const zb_rpc_call *call);

/* What a queued message costs beyond its own bytes (its grpc_byte_buffer,
 * some 320 bytes with its inline slices, and its queue slot, rounded up):
 * counted with it, so a queue of tiny messages is not taken for free. */
enum { ZB_RPC_MESSAGE_OVERHEAD = 512 };
/* The bytes a stream holds in messages queued or in flight (each with
 * ZB_RPC_MESSAGE_OVERHEAD): what a peer that stopped reading costs. */
long long zb_rpc_call_queued_bytes(const zb_rpc_call *call);
/* Those of them queued behind the message in flight: what zb_rpc_fail
 * frees at once. */
long long zb_rpc_call_backlog_bytes(const zb_rpc_call *call);
/* Streams counted together, for budgets over many of them (the
 * coordinator's watchers, per identity and in all). A call counted in an
 * account adds its queued bytes and itself to it and to every parent above
 * it, from zb_rpc_call_account until the server frees the call, which is
 * after the call ended and its last message left (a stream cut while one
 * message is in flight still counts). The caller owns the accounts; each
 * must outlive the calls counted in it (the server shut down: all freed). */
typedef struct zb_rpc_account {
  long long bytes; /* queued or in flight, as zb_rpc_call_queued_bytes */
  long long calls;
  struct zb_rpc_account *parent; /* NULL: none */
} zb_rpc_account;
/* Counts call in acct from now on (NULL: in none). */
void zb_rpc_call_account(zb_rpc_call *call, zb_rpc_account *acct);

/* ---- client ---- */

typedef struct zb_rpc_client zb_rpc_client;

/* Creates a channel to target ("host:port"): TLS with tls's certificate
 * as the client's, the coordinator's checked against tls's CA and the
 * target's host name; tls NULL: plaintext. Never blocks (the connection
 * is made on first use). */
zb_rpc_client *zb_rpc_client_new_tls(const char *target, long long max_message_bytes, const zb_tls *tls);
/* zb_rpc_client_new_tls without TLS. */
zb_rpc_client *zb_rpc_client_new(const char *target, long long max_message_bytes);
void zb_rpc_client_free(zb_rpc_client *c);

/* Blocking unary call with a deadline (timeout_ms > 0). wait_for_ready:
 * wait for the server to come up instead of failing with UNAVAILABLE.
 * Returns the gRPC status; on OK *resp is set, otherwise details holds the
 * server's message (or the transport's). */
grpc_status_code zb_rpc_unary(zb_rpc_client *c, const char *method, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                              int timeout_ms, bool wait_for_ready, char *details, size_t details_len);

/* A server-streaming call being read. */
typedef struct zb_rpc_stream zb_rpc_stream;
/* Starts the call (timeout_ms <= 0: no deadline). Does not wait for the
 * server; errors show up on the first read. */
zb_rpc_stream *zb_rpc_stream_open(zb_rpc_client *c, const char *method, const ProtobufCMessage *req,
                                  int timeout_ms, bool wait_for_ready);
/* Waits up to wait_ms (< 0: forever) for the next message. Returns 1 with
 * *msg set, 0 at the end of the stream (then zb_rpc_stream_status tells
 * how it ended), -1 when wait_ms passed with nothing (call again), -2 when
 * the message did not parse as resp_desc. */
int zb_rpc_stream_read(zb_rpc_stream *st, const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **msg,
                       int wait_ms);
/* Final status once read returned 0 (waits for it); details as above. */
grpc_status_code zb_rpc_stream_status(zb_rpc_stream *st, char *details, size_t details_len);
/* Cancels (if still running) and frees the stream. */
void zb_rpc_stream_free(zb_rpc_stream *st);

/* Name of a status code ("INVALID_ARGUMENT"). */
const char *zb_rpc_status_name(grpc_status_code code);

#endif
