/* watch.c — WatchJob streams (docs/wire.md, WatchJob). A watcher replays
 * the job's stored events a page at a time as its client reads, then gets
 * the live ones. What the coordinator holds for watchers is bounded in
 * bytes (docs/operations.md, Configuration): each stream's queue by
 * max_watch_bytes_per_stream, all of them together by
 * max_watch_bytes_total. A replaying watcher waits for its client to read;
 * a live one that an event does not fit is cut with RESOURCE_EXHAUSTED
 * naming the seq to resume after, its queue dropped at once; and when the
 * total is full, the watcher furthest behind is cut to make room (a client
 * that stopped reading must not keep the budget taken). One identity may
 * have max_streams_per_identity streams open. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "zb_alloc.h"
#include "zb_log.h"

/* ---- identities ---- */

/* Whose stream call is: the certificate's ROLE/NAME; in insecure mode,
 * where every caller is the same anonymous admin, the client's host (its
 * address without the port), so one runaway client elsewhere does not
 * take every stream (on loopback all clients are one host). */
static void stream_owner_key(const coord *co, zb_rpc_call *call, const zb_identity *who, char *key,
                             size_t cap) {
  if (co->tls) {
    snprintf(key, cap, "%s/%s", zb_role_name(who->role), who->name);
    return;
  }
  const char *peer = zb_rpc_call_peer(call); /* "ipv4:127.0.0.1:5555", "ipv6:[::1]:5555" */
  const char *colon = strrchr(peer, ':');
  size_t n = colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1)
                 ? (size_t)(colon - peer)
                 : strlen(peer);
  snprintf(key, cap, "%.*s", (int)n, peer);
}

/* The owner named key, made when new; owners with no stream left are
 * freed on the way (their accounts are empty: no call points at them). */
static coord_stream_owner *stream_owner(coord *co, const char *key) {
  coord_stream_owner *found = NULL;
  for (coord_stream_owner **pp = &co->stream_owners; *pp;) {
    coord_stream_owner *o = *pp;
    if (!strcmp(o->key, key)) {
      found = o;
    } else if (o->acct.calls == 0) {
      *pp = o->next;
      free(o);
      continue;
    }
    pp = &o->next;
  }
  if (found)
    return found;
  coord_stream_owner *o = zb_calloc(1, sizeof *o);
  snprintf(o->key, sizeof o->key, "%s", key);
  o->acct.parent = &co->watch_acct;
  o->next = co->stream_owners;
  co->stream_owners = o;
  return o;
}

/* Counts call in its identity's streams; false after failing it
 * (RESOURCE_EXHAUSTED naming the limit) when that identity has
 * max_streams_per_identity open already. */
static bool admit_stream(coord *co, zb_rpc_call *call) {
  zb_identity who;
  zb_rpc_call_identity(call, &who);
  char key[96];
  stream_owner_key(co, call, &who, key, sizeof key);
  coord_stream_owner *o = stream_owner(co, key);
  if (o->acct.calls >= co->cfg.max_streams_per_identity) {
    zb_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                "%s has %lld WatchJob streams open, the most one %s may (max_streams_per_identity in the "
                "coordinator's config): end one first",
                key, o->acct.calls, co->tls ? "identity" : "client host (insecure mode)");
    return false;
  }
  zb_rpc_call_account(call, &o->acct);
  return true;
}

/* ---- a watcher's end ---- */

/* Takes w off its job's list. */
static void watcher_unlink(coord_watcher *w) {
  coord_watcher **pp = &w->job->watchers;
  while (*pp && *pp != w)
    pp = &(*pp)->next;
  if (*pp)
    *pp = w->next;
}

static void watcher_closed(zb_rpc_call *call, void *arg) {
  (void)call;
  watcher_unlink(arg);
  free(arg);
}

/* Ends w's stream (after what is queued when code is OK; else dropping it)
 * and frees w. */
static void watcher_end(coord_watcher *w, grpc_status_code code, const char *details) {
  watcher_unlink(w);
  zb_rpc_call_on_close(w->call, NULL, NULL);
  zb_rpc_call_on_drain(w->call, NULL, NULL);
  if (code == GRPC_STATUS_OK)
    zb_rpc_stream_finish(w->call, code, details);
  else
    zb_rpc_fail(w->call, code, "%s", details);
  free(w);
}

/* Cuts w, which an event of size bytes does not fit (0: evicted to make
 * room for another's): its queue is dropped and the client told the seq
 * it has everything up to (the last message handed to gRPC, which reaches
 * it before the status). */
static void watcher_cut(coord_watcher *w, long long size, bool by_total) {
  coord *co = w->co;
  int64_t sent = zb_rpc_stream_sent_tag(w->call);
  long long resume = sent >= 0 ? sent : w->from, behind = zb_rpc_call_queued_bytes(w->call) + size;
  char why[256];
  if (by_total)
    snprintf(why, sizeof why,
             "watchers hold %lld bytes, the most all of them may (max_watch_bytes_total %lld): this one, "
             "%lld bytes behind, is cut; resume with after_seq=%lld",
             co->watch_acct.bytes, co->cfg.max_watch_bytes_total, behind, resume);
  else
    snprintf(why, sizeof why,
             "watcher fell behind by %lld bytes (budget %lld, max_watch_bytes_per_stream); resume with "
             "after_seq=%lld",
             behind, co->cfg.max_watch_bytes_per_stream, resume);
  ZB_DEBUG("job %s: watcher %s cut: %s", w->job->row.id, zb_rpc_call_peer(w->call), why);
  *(by_total ? &co->watch_cut_total : &co->watch_cut_behind) += 1;
  watcher_end(w, GRPC_STATUS_RESOURCE_EXHAUSTED, why);
}

/* ---- budgets ---- */

/* Whether size more bytes would take w past its own budget. A watcher with
 * nothing queued takes one event whatever its size, or an event larger
 * than the budget could never be watched. */
static bool watch_over_own(const coord_watcher *w, long long size) {
  long long held = zb_rpc_call_queued_bytes(w->call);
  return held > 0 && held + size > w->co->cfg.max_watch_bytes_per_stream;
}

/* The watcher with the most queued behind its message in flight (the
 * furthest behind, whose cut frees the most); NULL when none has any. */
static coord_watcher *watch_furthest_behind(coord *co) {
  coord_watcher *far = NULL;
  long long most = 0;
  for (coord_job *j = co->jobs; j; j = j->next)
    for (coord_watcher *w = j->watchers; w; w = w->next)
      if (zb_rpc_call_backlog_bytes(w->call) > most) {
        most = zb_rpc_call_backlog_bytes(w->call);
        far = w;
      }
  return far;
}

/* Room in the total for size more bytes for w: while they would pass
 * max_watch_bytes_total, the watcher furthest behind is cut (w itself when
 * it is). False when no room could be made: then w has been cut. */
static bool watch_make_room(coord_watcher *w, long long size) {
  coord *co = w->co;
  while (co->watch_acct.bytes + size > co->cfg.max_watch_bytes_total) {
    coord_watcher *far = watch_furthest_behind(co);
    if (!far || far == w) {
      watcher_cut(w, size, true);
      return false;
    }
    watcher_cut(far, 0, true);
  }
  return true;
}

/* ---- replay ---- */

/* Stored event e, packed as a JobEvent (zb_rpc_pack; the caller destroys
 * it). */
static grpc_byte_buffer *watch_pack_stored(const zb_store_event *e) {
  Zb__V1__JobEvent ev = ZB__V1__JOB_EVENT__INIT;
  ev.seq = e->seq;
  ev.unix_ms = e->unix_ms;
  ev.state = (Zb__V1__JobState)e->state;
  ev.reason = (char *)e->reason;
  if (e->iteration)
    ev.iteration = (Zb__V1__IterationMetrics *)protobuf_c_message_unpack(
        &zb__v1__iteration_metrics__descriptor, NULL, e->iteration_len, e->iteration);
  grpc_byte_buffer *bb = zb_rpc_pack(&ev.base);
  if (ev.iteration)
    protobuf_c_message_free_unpacked(&ev.iteration->base, NULL);
  return bb;
}

/* Queues stored events evs (n) on w while they fit its budget and the
 * total; past the total with nothing queued, as no drain would come to try
 * again, it makes room (watch_make_room: cuts the watcher furthest behind,
 * or w). */
static void watch_queue_stored(coord_watcher *w, const zb_store_event *evs, int n) {
  coord *co = w->co;
  for (int k = 0; k < n; k++) {
    grpc_byte_buffer *bb = watch_pack_stored(&evs[k]);
    long long size = (long long)grpc_byte_buffer_length(bb) + ZB_RPC_MESSAGE_OVERHEAD;
    bool wait = watch_over_own(w, size) || (co->watch_acct.bytes + size > co->cfg.max_watch_bytes_total &&
                                            zb_rpc_call_queued_bytes(w->call) > 0);
    if (wait || !watch_make_room(w, size)) { /* the rest when these are read; or w was cut */
      grpc_byte_buffer_destroy(bb);
      return;
    }
    zb_rpc_stream_write_packed(w->call, bb, evs[k].seq);
    grpc_byte_buffer_destroy(bb);
    w->after = evs[k].seq;
  }
}

/* Sends the watcher its next page of stored events (an on_drain callback;
 * arg the watcher): paced by the client's reading, each page within its
 * byte budget. Caught up (no stored event after the last sent), it goes
 * live, or its stream ends when the job has. */
static void watch_pump(zb_rpc_call *call, void *arg) {
  (void)call;
  coord_watcher *w = arg;
  if (w->live)
    return;
  zb_store_event *evs = NULL;
  int n = 0;
  zb_diag d;
  if (zb_store_list_events_limit(w->co->store, w->job->row.id, w->after, COORD_WATCH_PAGE,
                                 w->co->cfg.max_watch_bytes_per_stream, &evs, &n, &d) != ZB_OK) {
    char why[300];
    snprintf(why, sizeof why, "store: %.280s", d.msg);
    watcher_end(w, GRPC_STATUS_INTERNAL, why);
    return;
  }
  if (n > 0) { /* w cut, or more may follow: the next page when these are read */
    watch_queue_stored(w, evs, n);
    zb_store_events_free(evs, n);
    return;
  }
  if (job_terminal(w->job))
    watcher_end(w, GRPC_STATUS_OK, "");
  else
    w->live = true; /* caught up: watch_send_live sends the next ones */
}

void on_watch(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__WatchJobRequest *req = (const void *)m;
  coord_job *j = job_lookup(co, call, req->job_id);
  if (!j)
    return;
  if (req->after_seq < 0) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "after_seq: %" PRId64 " is negative", req->after_seq);
    return;
  }
  if (!admit_stream(co, call))
    return;
  coord_watcher *w = zb_calloc(1, sizeof *w);
  *w = (coord_watcher){
      .call = call, .co = co, .job = j, .after = req->after_seq, .from = req->after_seq, .next = j->watchers};
  j->watchers = w;
  zb_rpc_call_on_close(call, watcher_closed, w);
  zb_rpc_call_on_drain(call, watch_pump, w);
  watch_pump(call, w);
}

/* ---- live ---- */

void watch_send_live(coord_job *j, const Zb__V1__JobEvent *ev) {
  grpc_byte_buffer *bb = NULL; /* packed once, its bytes shared by every watcher's queue */
  long long size = 0;
  for (coord_watcher *w = j->watchers; w;) {
    if (!w->live || w->after >= ev->seq) { /* replaying (the store has it), or sent it */
      w = w->next;
      continue;
    }
    if (!bb) {
      bb = zb_rpc_pack(&ev->base);
      size = (long long)grpc_byte_buffer_length(bb) + ZB_RPC_MESSAGE_OVERHEAD;
    }
    if (watch_over_own(w, size)) {
      watcher_cut(w, size, false);
      w = j->watchers; /* from the list's head again: those sent to are past */
      continue;
    }
    if (!watch_make_room(w, size)) { /* w was cut, and maybe others */
      w = j->watchers;
      continue;
    }
    zb_rpc_stream_write_packed(w->call, bb, ev->seq);
    w->after = ev->seq;
    w = w->next; /* still in the list: cuts of others unlinked them */
  }
  if (bb)
    grpc_byte_buffer_destroy(bb);
}

void watch_end_live(coord_job *j) {
  for (coord_watcher *w = j->watchers, *next; w; w = next) {
    next = w->next;
    if (!w->live)
      continue;
    if (zb_rpc_call_queued_bytes(w->call) == 0)
      watcher_end(w, GRPC_STATUS_OK, "");
    else
      w->live = false; /* ends once read (watch_pump), a watcher until then: the total may cut it */
  }
}

void watch_free_all(coord_job *j) {
  for (coord_watcher *w = j->watchers, *next; w; w = next) {
    next = w->next;
    free(w);
  }
  j->watchers = NULL;
}

void watch_free_owners(coord *co) {
  for (coord_stream_owner *o = co->stream_owners, *next; o; o = next) {
    next = o->next;
    free(o);
  }
  co->stream_owners = NULL;
}
