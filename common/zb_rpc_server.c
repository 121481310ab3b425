/* zb_rpc_server.c — the server side of the gRPC glue: one completion-queue
 * thread per server takes gRPC's events and hands them to the libuv loop
 * (zb_rpc_handoff.c), which runs every handler; replies and stream writes
 * go back through per-call op batches (one batch per RPC shape: a unary
 * reply carries its message, status and close together). See
 * docs/architecture.md, Threads.
 */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_log.h"
#include "zb_rpc_arena.h"
#include "zb_rpc_handoff.h"
#include "zb_rpc_internal.h"

typedef enum rpc_tag_kind {
  TAG_NEW_CALL,
  TAG_UNKNOWN_CALL,
  TAG_UNKNOWN_DONE,
  TAG_CLOSE,
  TAG_SEND,
  TAG_STATUS,
  TAG_SHUTDOWN
} rpc_tag_kind;

/* Every tag handed to gRPC points at one of these, embedded in its owner. */
typedef struct rpc_tag {
  rpc_tag_kind kind;
  void *owner;
} rpc_tag;

/* Requests kept outstanding per method: a call that arrives finds one
 * armed and completes on the completion-queue thread as it reads it; with
 * one, calls that came meanwhile wait in gRPC until the loop re-arms, and
 * each then completes from the loop thread, which must wake the
 * completion-queue thread to hand it back (docs/architecture.md, Threads). */
enum { RPC_SLOTS_PER_METHOD = 32 };

/* One outstanding request for a registered method (re-armed on each call). */
typedef struct method_slot {
  rpc_tag tag;
  zb_rpc_server *srv;
  const zb_rpc_method *m;
  void *registered;
  grpc_completion_queue *bound_cq;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
} method_slot;

/* The catch-all for methods we do not serve (else they hang to the
 * client's deadline instead of getting UNIMPLEMENTED). */
typedef struct unknown_slot {
  rpc_tag tag, done_tag;
  grpc_call *call;
  grpc_call_details details;
  grpc_metadata_array md;
} unknown_slot;

/* A message queued on a stream: its bytes as counted (with
 * ZB_RPC_MESSAGE_OVERHEAD) and the caller's tag (-1: none). */
typedef struct rpc_out {
  grpc_byte_buffer *bb;
  long long bytes;
  int64_t tag;
} rpc_out;

struct zb_rpc_call {
  zb_rpc_server *srv;
  grpc_call *call;
  int refs;
  char *peer;
  rpc_tag close_tag, send_tag, status_tag;
  int cancelled; /* written by RECV_CLOSE_ON_SERVER */
  bool closed;   /* RECV_CLOSE completed */
  bool ended;    /* we ended it, or the peer went away and on_close ran */
  bool md_sent, send_busy, finishing;
  bool close_posted; /* RECV_CLOSE_ON_SERVER is in flight or done */
  grpc_status_code fin_code;
  char *fin_details;
  rpc_out *queue;
  int q_head, q_len, q_cap;
  long long q_bytes, busy_bytes; /* queued; the message in flight */
  int64_t sent_tag;              /* the last message handed to gRPC (zb_rpc_stream_sent_tag) */
  zb_rpc_account *acct;          /* NULL: counted in none */
  void (*on_close)(zb_rpc_call *, void *);
  void *on_close_arg;
  void (*on_drain)(zb_rpc_call *, void *);
  void *on_drain_arg;
  struct zb_rpc_call *prev, *next; /* the server's live calls, or its spare ones */
};

/* Ended calls kept for the next ones (a call costs no malloc then), and
 * the bytes every request is unpacked into (zb_rpc_arena.h). */
enum { RPC_SPARE_CALLS = 64, RPC_ARENA_BYTES = 64 << 10 };

struct zb_rpc_server {
  uv_loop_t *loop;
  grpc_server *server;
  grpc_completion_queue *cq;
  grpc_completion_queue *unary_cq; /* where unary calls complete (rpc_drain_unary) */
  rpc_handoff *handoff;            /* the completion-queue thread and its queue to the loop */
  zb_rpc_call *spare;              /* ended calls to reuse, linked by next */
  int n_spare;
  rpc_arena arena; /* the request being handled is unpacked here */
  const zb_rpc_method *methods;
  int n_methods;
  method_slot *slots;
  unknown_slot unknown;
  void *user;
  zb_rpc_call *live;
  bool shutting_down;
  /* the server shut down and its queue with it: a batch started now
   * would abort gRPC (grpc_cq_begin_op), so none is (rpc_start) */
  bool cq_shut;
  rpc_tag shutdown_tag;
  void (*done)(void *);
  void *done_arg;
  bool secure; /* TLS: callers are who their certificates say */
};

static void rpc_arm_slot(method_slot *sl) {
  grpc_metadata_array_init(&sl->md);
  sl->call = NULL;
  sl->payload = NULL;
  grpc_call_error e =
      grpc_server_request_registered_call(sl->srv->server, sl->registered, &sl->call, &sl->deadline, &sl->md,
                                          &sl->payload, sl->bound_cq, sl->srv->cq, &sl->tag);
  if (e != GRPC_CALL_OK)
    ZB_ERROR("rpc: cannot accept calls for %s (grpc_call_error %d)", sl->m->path, (int)e);
}

static void rpc_arm_unknown(zb_rpc_server *srv) {
  unknown_slot *u = &srv->unknown;
  grpc_call_details_init(&u->details);
  grpc_metadata_array_init(&u->md);
  u->call = NULL;
  grpc_server_request_call(srv->server, &u->call, &u->details, &u->md, srv->cq, srv->cq, &u->tag);
}

/* Adds bytes and calls to acct and every account above it. */
static void rpc_account_add(zb_rpc_account *acct, long long bytes, long long calls) {
  for (; acct; acct = acct->parent) {
    acct->bytes += bytes;
    acct->calls += calls;
  }
}

/* Drops the messages queued behind the one in flight. */
static void rpc_queue_drop(zb_rpc_call *c) {
  for (; c->q_len > 0; c->q_len--, c->q_head = (c->q_head + 1) % c->q_cap)
    grpc_byte_buffer_destroy(c->queue[c->q_head].bb);
  rpc_account_add(c->acct, -c->q_bytes, 0);
  c->q_bytes = 0;
}

static void rpc_call_unref(zb_rpc_call *c) {
  if (--c->refs > 0)
    return;
  zb_rpc_server *srv = c->srv;
  if (c->prev)
    c->prev->next = c->next;
  else
    srv->live = c->next;
  if (c->next)
    c->next->prev = c->prev;
  rpc_queue_drop(c);
  rpc_account_add(c->acct, -c->busy_bytes, -1); /* a send whose batch never started */
  free(c->queue);
  free(c->fin_details);
  gpr_free(c->peer);
  grpc_call_unref(c->call);
  if (srv->n_spare == RPC_SPARE_CALLS) {
    free(c);
    return;
  }
  c->next = srv->spare;
  srv->spare = c;
  srv->n_spare++;
}

/* A zeroed call: a spare one, or a new one. */
static zb_rpc_call *rpc_call_new(zb_rpc_server *srv) {
  zb_rpc_call *c = srv->spare;
  if (!c)
    return zb_calloc(1, sizeof *c);
  srv->spare = c->next;
  srv->n_spare--;
  memset(c, 0, sizeof *c);
  return c;
}

static void rpc_start(zb_rpc_call *c, const grpc_op *ops, size_t n, rpc_tag *tag) {
  c->refs++;
  if (c->srv->cq_shut) { /* a handler ending its call after shutdown (a drained watcher): it fails */
    ZB_DEBUG("rpc: a batch after shutdown fails without going to gRPC");
    rpc_handoff_post(c->srv->handoff, tag, 0);
    return;
  }
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
  if (e != GRPC_CALL_OK) {
    ZB_ERROR("rpc: start_batch failed (grpc_call_error %d)", (int)e);
    c->refs--;
  }
}

/* A unary call's RECV_CLOSE_ON_SERVER rides in its final batch (one
 * completion instead of two); a streaming call posted its own at start. */
static void rpc_add_close(zb_rpc_call *c, grpc_op *ops, size_t *n) {
  if (c->close_posted)
    return;
  c->close_posted = true;
  c->closed = true; /* nothing waits on it: the call ends with this batch */
  ops[*n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[*n].data.recv_close_on_server.cancelled = &c->cancelled;
  (*n)++;
}

/* The first batch of a call carries the initial metadata. */
static void rpc_add_initial_md(zb_rpc_call *c, grpc_op *ops, size_t *n) {
  if (c->md_sent)
    return;
  c->md_sent = true;
  ops[(*n)++].op = GRPC_OP_SEND_INITIAL_METADATA;
}

/* Ends the call: the last message (bb, may be NULL; destroyed here) and
 * the status in one batch; gives up the handler's reference. */
static void rpc_send_status(zb_rpc_call *c, grpc_byte_buffer *bb, grpc_status_code code,
                            const char *details) {
  grpc_slice det = grpc_slice_from_copied_string(details ? details : "");
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  rpc_add_initial_md(c, ops, &n);
  if (bb) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = code;
  ops[n++].data.send_status_from_server.status_details = &det;
  rpc_add_close(c, ops, &n);
  rpc_start(c, ops, n, &c->status_tag);
  if (bb)
    grpc_byte_buffer_destroy(bb); /* gRPC took the slices */
  grpc_slice_unref(det);
  c->ended = true;
  rpc_call_unref(c); /* the handler's reference */
}

static void rpc_send_next(zb_rpc_call *c) {
  if (c->send_busy || c->q_len == 0)
    return;
  rpc_out out = c->queue[c->q_head];
  c->q_head = (c->q_head + 1) % c->q_cap;
  c->q_len--;
  c->q_bytes -= out.bytes;
  c->busy_bytes = out.bytes; /* still held until its send completes */
  c->sent_tag = out.tag;
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  rpc_add_initial_md(c, ops, &n);
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = out.bb;
  c->send_busy = true;
  rpc_start(c, ops, n, &c->send_tag);
  grpc_byte_buffer_destroy(out.bb); /* gRPC took the slices */
}

void zb_rpc_reply(zb_rpc_call *c, const ProtobufCMessage *msg) {
  if (c->ended || c->finishing)
    return;
  rpc_send_status(c, rpc_pack(msg), GRPC_STATUS_OK, "");
}

grpc_byte_buffer *zb_rpc_pack(const ProtobufCMessage *msg) {
  return rpc_pack(msg);
}

void zb_rpc_reply_packed(zb_rpc_call *c, grpc_byte_buffer *packed) {
  if (c->ended || c->finishing) {
    grpc_byte_buffer_destroy(packed);
    return;
  }
  rpc_send_status(c, packed, GRPC_STATUS_OK, "");
}

void zb_rpc_fail(zb_rpc_call *c, grpc_status_code code, const char *fmt, ...) {
  if (c->ended || c->finishing)
    return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rpc_queue_drop(c); /* what a stream had queued: the status says it all */
  if (c->send_busy) {
    c->finishing = true;
    c->fin_code = code;
    c->fin_details = zb_strdup(msg);
    return;
  }
  rpc_send_status(c, NULL, code, msg);
}

/* Queues bb (taken over) with tag and sends it when it is its turn. */
static void rpc_queue_push(zb_rpc_call *c, grpc_byte_buffer *bb, int64_t tag) {
  if (c->q_len == c->q_cap) {
    int cap = c->q_cap ? 2 * c->q_cap : 8;
    rpc_out *q = zb_malloc(sizeof *q * (size_t)cap);
    for (int k = 0; k < c->q_len; k++)
      q[k] = c->queue[(c->q_head + k) % c->q_cap];
    free(c->queue);
    c->queue = q;
    c->q_head = 0;
    c->q_cap = cap;
  }
  long long bytes = (long long)grpc_byte_buffer_length(bb) + ZB_RPC_MESSAGE_OVERHEAD;
  c->queue[(c->q_head + c->q_len) % c->q_cap] = (rpc_out){bb, bytes, tag};
  c->q_len++;
  c->q_bytes += bytes;
  rpc_account_add(c->acct, bytes, 0);
  rpc_send_next(c);
}

void zb_rpc_stream_write(zb_rpc_call *c, const ProtobufCMessage *msg) {
  if (!c->ended && !c->finishing)
    rpc_queue_push(c, rpc_pack(msg), -1);
}

void zb_rpc_stream_write_packed(zb_rpc_call *c, const grpc_byte_buffer *packed, int64_t tag) {
  if (!c->ended && !c->finishing) /* a copy of a raw buffer shares its slices */
    rpc_queue_push(c, grpc_byte_buffer_copy((grpc_byte_buffer *)packed), tag < 0 ? -1 : tag);
}

int64_t zb_rpc_stream_sent_tag(const zb_rpc_call *c) {
  return c->sent_tag;
}

void zb_rpc_stream_finish(zb_rpc_call *c, grpc_status_code code, const char *details) {
  if (c->ended || c->finishing)
    return;
  if (c->send_busy || c->q_len > 0) {
    c->finishing = true;
    c->fin_code = code;
    c->fin_details = zb_strdup(details ? details : "");
    return;
  }
  rpc_send_status(c, NULL, code, details);
}

void zb_rpc_call_on_close(zb_rpc_call *c, void (*cb)(zb_rpc_call *, void *), void *arg) {
  c->on_close = cb;
  c->on_close_arg = arg;
}

void zb_rpc_call_on_drain(zb_rpc_call *c, void (*cb)(zb_rpc_call *, void *), void *arg) {
  c->on_drain = cb;
  c->on_drain_arg = arg;
}

/* Asked for rarely (logs): made on the first ask, not for every call. */
const char *zb_rpc_call_peer(zb_rpc_call *c) {
  if (!c->peer)
    c->peer = grpc_call_get_peer(c->call);
  return c->peer ? c->peer : "?";
}
int zb_rpc_call_queued(const zb_rpc_call *c) {
  return c->q_len + (c->send_busy ? 1 : 0);
}

long long zb_rpc_call_queued_bytes(const zb_rpc_call *c) {
  return c->q_bytes + c->busy_bytes;
}

long long zb_rpc_call_backlog_bytes(const zb_rpc_call *c) {
  return c->q_bytes;
}

void zb_rpc_call_account(zb_rpc_call *c, zb_rpc_account *acct) {
  long long held = c->q_bytes + c->busy_bytes;
  rpc_account_add(c->acct, -held, -1);
  c->acct = acct;
  rpc_account_add(acct, held, 1);
}

static void rpc_on_new_call(method_slot *sl) {
  zb_rpc_server *srv = sl->srv;
  grpc_call *call = sl->call;
  grpc_byte_buffer *payload = sl->payload;
  grpc_metadata_array_destroy(&sl->md);
  if (!srv->shutting_down)
    rpc_arm_slot(sl); /* re-arm first, so the next call is not kept waiting */

  zb_rpc_call *c = rpc_call_new(srv);
  c->srv = srv;
  c->call = call;
  c->refs = 1; /* the handler's */
  c->close_tag = (rpc_tag){TAG_CLOSE, c};
  c->send_tag = (rpc_tag){TAG_SEND, c};
  c->status_tag = (rpc_tag){TAG_STATUS, c};
  c->sent_tag = -1;
  c->next = srv->live;
  if (srv->live)
    srv->live->prev = c;
  srv->live = c;
  if (sl->m->streaming || sl->m->deferred) {
    grpc_op close_op;
    memset(&close_op, 0, sizeof close_op);
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &c->cancelled;
    c->close_posted = true;
    rpc_start(c, &close_op, 1, &c->close_tag);
  }

  if (!payload) { /* no message at all: the client gave up (deadline, cancel) before sending it */
    ZB_DEBUG("rpc: %s from %s arrived without a request message", sl->m->path, zb_rpc_call_peer(c));
    zb_rpc_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "request: no %s message", sl->m->request->name);
    return;
  }
  char nul_field[128];
  ProtobufCMessage *req =
      rpc_unpack_strict(payload, sl->m->request, &srv->arena.allocator, nul_field, sizeof nul_field);
  grpc_byte_buffer_destroy(payload);
  if (nul_field[0]) { /* "j-1\0j-2" would be read as "j-1" */
    rpc_arena_release(&srv->arena, NULL);
    zb_rpc_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: contains a NUL byte", nul_field);
    return;
  }
  if (!req) {
    rpc_arena_release(&srv->arena, NULL);
    ZB_WARN("rpc: %s from %s: request is not a valid %s", sl->m->path, zb_rpc_call_peer(c),
            sl->m->request->name);
    zb_rpc_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "request is not a valid %s message", sl->m->request->name);
    return;
  }
  sl->m->handler(c, req, srv->user);
  rpc_arena_release(&srv->arena, req);
  if (!sl->m->streaming && !sl->m->deferred && !c->ended && !c->finishing) /* a unary handler that forgot */
    zb_rpc_fail(c, GRPC_STATUS_INTERNAL, "%s: no answer", sl->m->path);
}

static void rpc_on_unknown_call(zb_rpc_server *srv) {
  unknown_slot *u = &srv->unknown;
  char *method = grpc_slice_to_c_string(u->details.method);
  ZB_WARN("rpc: unknown method %s", method);
  gpr_free(method);
  grpc_call *call = u->call;
  grpc_call_details_destroy(&u->details);
  grpc_metadata_array_destroy(&u->md);
  /* answer on the side; the call is unref'd when that completes */
  static int cancelled_ignored;
  grpc_slice det = grpc_slice_from_static_string("zb-coordinator does not serve this method");
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[1].data.send_status_from_server.status = GRPC_STATUS_UNIMPLEMENTED;
  ops[1].data.send_status_from_server.status_details = &det;
  ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[2].data.recv_close_on_server.cancelled = &cancelled_ignored;
  u->done_tag = (rpc_tag){TAG_UNKNOWN_DONE, call};
  /* one unknown call at a time: the slot re-arms once this one is done */
  if (srv->cq_shut || grpc_call_start_batch(call, ops, 3, &u->done_tag, NULL) != GRPC_CALL_OK) {
    grpc_call_unref(call);
    if (!srv->shutting_down)
      rpc_arm_unknown(srv);
  }
}

static void rpc_handle(void *t, int success, void *arg) {
  zb_rpc_server *srv = arg;
  rpc_tag *tag = t;
  switch (tag->kind) {
  case TAG_NEW_CALL: {
    method_slot *sl = tag->owner;
    if (!success) { /* shutting down: the slot is not re-armed */
      grpc_metadata_array_destroy(&sl->md);
      return;
    }
    rpc_on_new_call(sl);
    return;
  }
  case TAG_UNKNOWN_CALL:
    if (!success) {
      grpc_call_details_destroy(&srv->unknown.details);
      grpc_metadata_array_destroy(&srv->unknown.md);
      return;
    }
    rpc_on_unknown_call(srv);
    return;
  case TAG_UNKNOWN_DONE:
    grpc_call_unref(tag->owner);
    if (!srv->shutting_down)
      rpc_arm_unknown(srv);
    return;
  case TAG_CLOSE: {
    zb_rpc_call *c = tag->owner;
    c->closed = true;
    if (!c->ended) { /* the peer left before we ended the call */
      c->ended = true;
      if (c->on_close)
        c->on_close(c, c->on_close_arg);
      rpc_call_unref(c); /* the handler's */
    }
    rpc_call_unref(c);
    return;
  }
  case TAG_SEND: {
    zb_rpc_call *c = tag->owner;
    c->send_busy = false;
    rpc_account_add(c->acct, -c->busy_bytes, 0);
    c->busy_bytes = 0;
    if (!success) /* the peer is gone; RECV_CLOSE will tell */
      rpc_queue_drop(c);
    if (c->q_len > 0)
      rpc_send_next(c);
    else if (c->finishing && !c->ended)
      rpc_send_status(c, NULL, c->fin_code, c->fin_details);
    else if (success && !c->ended && c->on_drain)
      c->on_drain(c, c->on_drain_arg); /* may queue more: it holds a reference meanwhile */
    rpc_call_unref(c);
    return;
  }
  case TAG_STATUS: rpc_call_unref(tag->owner); return;
  case TAG_SHUTDOWN:
    srv->cq_shut = true;
    grpc_completion_queue_shutdown(srv->cq);
    return;
  }
}

static void rpc_finish_shutdown(void *arg);

/* A unary call answered at once has one completion: its reply sent,
 * which only gives back a reference. Such calls are bound to a second,
 * non-polling queue (no thread waits on it), so that completion wakes no
 * thread; the loop takes what is there after each batch of events, each
 * of which (a new call) is what started them. */
static void rpc_drain_unary(void *arg) {
  zb_rpc_server *srv = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(srv->unary_cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type != GRPC_OP_COMPLETE)
      return;
    rpc_handle(ev.tag, ev.success, srv);
  }
}

zb_err zb_rpc_server_start(uv_loop_t *loop, const char *addr, long long max_message_bytes,
                           const zb_rpc_method *methods, int n_methods, void *user, const zb_tls *tls,
                           zb_rpc_server **out, int *bound_port, zb_diag *diag) {
  rpc_grpc_init();
  zb_rpc_server *srv = zb_calloc(1, sizeof *srv);
  srv->loop = loop;
  srv->methods = methods;
  srv->n_methods = n_methods;
  srv->user = user;
  rpc_arena_init(&srv->arena, RPC_ARENA_BYTES);
  grpc_arg args[RPC_SERVER_ARGS];
  rpc_server_args(args, max_message_bytes);
  grpc_channel_args ch_args = {.num_args = RPC_SERVER_ARGS, .args = args};
  srv->server = grpc_server_create(&ch_args, NULL);
  srv->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
  grpc_completion_queue_attributes qa = {
      .version = 1, .cq_completion_type = GRPC_CQ_NEXT, .cq_polling_type = GRPC_CQ_NON_POLLING};
  srv->unary_cq = grpc_completion_queue_create(grpc_completion_queue_factory_lookup(&qa), &qa, NULL);
  grpc_server_register_completion_queue(srv->server, srv->unary_cq, NULL);
  srv->slots = zb_calloc((size_t)n_methods * RPC_SLOTS_PER_METHOD, sizeof *srv->slots);
  for (int k = 0; k < n_methods; k++) {
    void *registered = grpc_server_register_method(srv->server, methods[k].path, NULL,
                                                   GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    for (int i = 0; i < RPC_SLOTS_PER_METHOD; i++) {
      method_slot *sl = &srv->slots[k * RPC_SLOTS_PER_METHOD + i];
      sl->tag = (rpc_tag){TAG_NEW_CALL, sl};
      sl->srv = srv;
      sl->m = &methods[k];
      sl->registered = registered;
      /* streams and deferred calls wait on the peer: their events wake the loop */
      sl->bound_cq = methods[k].streaming || methods[k].deferred ? srv->cq : srv->unary_cq;
    }
  }
  srv->unknown.tag = (rpc_tag){TAG_UNKNOWN_CALL, srv};
  srv->secure = tls != NULL;
  grpc_server_credentials *creds = rpc_server_creds(tls);
  int port = grpc_server_add_http2_port(srv->server, addr, creds);
  grpc_server_credentials_release(creds);
  zb_err err = ZB_OK;
  if (port <= 0)
    err = zb_diag_set(diag, ZB_ERR_INVALID_ARG, "cannot listen on %s (address in use or invalid)", addr);
  rpc_handoff_ops ops = {
      .on_event = rpc_handle, .after_batch = rpc_drain_unary, .on_drained = rpc_finish_shutdown, .arg = srv};
  if (err == ZB_OK)
    err = rpc_handoff_start(loop, srv->cq, &ops, &srv->handoff, diag);
  if (err != ZB_OK) {
    grpc_server_destroy(srv->server);
    grpc_completion_queue_shutdown(srv->cq);
    while (grpc_completion_queue_next(srv->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
      ;
    grpc_completion_queue_destroy(srv->cq);
    grpc_completion_queue_shutdown(srv->unary_cq);
    grpc_completion_queue_destroy(srv->unary_cq);
    rpc_arena_destroy(&srv->arena);
    free(srv->slots);
    free(srv);
    grpc_shutdown();
    return err;
  }
  grpc_server_start(srv->server);
  for (int k = 0; k < n_methods * RPC_SLOTS_PER_METHOD; k++)
    rpc_arm_slot(&srv->slots[k]);
  rpc_arm_unknown(srv);
  if (bound_port)
    *bound_port = port;
  *out = srv;
  return ZB_OK;
}

void zb_rpc_server_shutdown(zb_rpc_server *srv, void (*done)(void *), void *arg) {
  if (srv->shutting_down)
    return;
  srv->shutting_down = true;
  srv->done = done;
  srv->done_arg = arg;
  srv->shutdown_tag = (rpc_tag){TAG_SHUTDOWN, srv};
  grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
  grpc_server_cancel_all_calls(srv->server);
}

static void rpc_on_handoff_closed(void *a) {
  zb_rpc_server *srv = a;
  void (*done)(void *) = srv->done;
  void *arg = srv->done_arg;
  while (srv->spare) {
    zb_rpc_call *c = srv->spare;
    srv->spare = c->next;
    free(c);
  }
  rpc_arena_destroy(&srv->arena);
  free(srv->slots);
  free(srv);
  grpc_shutdown();
  if (done)
    done(arg);
}

/* The queue shut down and its every event was handled: the thread is
 * joined (rpc_handoff_close) before the queue it waited on is destroyed,
 * and the unary calls' last completions are taken first. */
static void rpc_finish_shutdown(void *arg) {
  zb_rpc_server *srv = arg;
  rpc_handoff_close(srv->handoff, rpc_on_handoff_closed, srv);
  grpc_completion_queue_shutdown(srv->unary_cq); /* its last calls ended with the server's */
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(srv->unary_cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type != GRPC_OP_COMPLETE)
      break;
    rpc_handle(ev.tag, ev.success, srv);
  }
  if (srv->live)
    ZB_WARN("rpc: %s still referenced at shutdown", "a call");
  grpc_server_destroy(srv->server);
  grpc_completion_queue_destroy(srv->cq);
  grpc_completion_queue_destroy(srv->unary_cq);
}

void zb_rpc_call_identity(const zb_rpc_call *call, zb_identity *out) {
  rpc_identity_of_call(call->call, call->srv->secure, out);
}
