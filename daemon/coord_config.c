/* coord_config.c — the coordinator's config: defaults and the YAML reader
 * (zb_yaml.h). Type errors are ZB_ERR_PARSE; values of the right type but
 * out of range are ZB_ERR_INVALID_ARG.
 */
#include "coord_config.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_log.h"
#include "zb_yaml.h"

typedef enum coord_key {
  CO_LISTEN,
  CO_METRICS_LISTEN,
  CO_DATA_DIR,
  CO_HEARTBEAT,
  CO_LOG_LEVEL,
  CO_MAX_MESSAGE,
  CO_TLS_CA,
  CO_TLS_CERT,
  CO_TLS_KEY,
  CO_MAX_PLAN_OPS,
  CO_RETAIN_JOBS,
  CO_RETAIN_S,
  CO_METRICS_KEEP,
  CO_MAX_PENDING,
  CO_PLANS,
  CO_PLANS_PER_ID,
  CO_MAX_STREAMS,
  CO_WATCH_BYTES,
  CO_WATCH_TOTAL,
  CO_COUNT_
} coord_key;
/* by key, so that each name sits next to its key */
static const char *const coord_keys[CO_COUNT_] = {[CO_LISTEN] = "listen",
                                                  [CO_METRICS_LISTEN] = "metrics_listen",
                                                  [CO_DATA_DIR] = "data_dir",
                                                  [CO_HEARTBEAT] = "heartbeat_timeout_ms",
                                                  [CO_LOG_LEVEL] = "log_level",
                                                  [CO_MAX_MESSAGE] = "max_message_bytes",
                                                  [CO_TLS_CA] = "tls_ca",
                                                  [CO_TLS_CERT] = "tls_cert",
                                                  [CO_TLS_KEY] = "tls_key",
                                                  [CO_MAX_PLAN_OPS] = "max_plan_ops",
                                                  [CO_RETAIN_JOBS] = "retain_finished_jobs",
                                                  [CO_RETAIN_S] = "retain_finished_s",
                                                  [CO_METRICS_KEEP] = "metrics_keep_ended_s",
                                                  [CO_MAX_PENDING] = "max_pending_per_identity",
                                                  [CO_PLANS] = "max_concurrent_plans",
                                                  [CO_PLANS_PER_ID] = "max_concurrent_plans_per_identity",
                                                  [CO_MAX_STREAMS] = "max_streams_per_identity",
                                                  [CO_WATCH_BYTES] = "max_watch_bytes_per_stream",
                                                  [CO_WATCH_TOTAL] = "max_watch_bytes_total"};

static const zb_yaml_int_range HEARTBEAT_RANGE = {0, 100, 600000};
static const zb_yaml_int_range MAX_MESSAGE_RANGE = {0, 4096, 1073741824};
static const zb_yaml_int_range MAX_PLAN_OPS_RANGE = {0, 1000, 1LL << 31};
static const zb_yaml_int_range RETAIN_JOBS_RANGE = {0, 1, 10000000};
static const zb_yaml_int_range RETAIN_S_RANGE = {0, 1, 10LL * 366 * 86400};
static const zb_yaml_int_range METRICS_KEEP_RANGE = {0, 1, 86400};
static const zb_yaml_int_range MAX_PENDING_RANGE = {0, 1, 1000000};
/* libuv's thread pool has 4 threads by default (UV_THREADPOOL_SIZE) */
static const zb_yaml_int_range PLANS_RANGE = {0, 1, 4};
static const zb_yaml_int_range WATCH_BYTES_RANGE = {0, 64 << 10, 1 << 30};
static const zb_yaml_int_range WATCH_TOTAL_RANGE = {0, 1 << 20, 1LL << 40};

void zb_coord_config_default(zb_coord_config *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->listen, sizeof c->listen, "127.0.0.1:7070");
  snprintf(c->metrics_listen, sizeof c->metrics_listen, "127.0.0.1:9464");
  snprintf(c->data_dir, sizeof c->data_dir, "/var/lib/zb");
  c->heartbeat_timeout_ms = 5000;
  snprintf(c->log_level, sizeof c->log_level, "info");
  c->max_message_bytes = 16777216;
  c->max_plan_ops = 1 << 24;
  c->retain_finished_jobs = 1000;
  c->retain_finished_s = 7 * 86400;
  c->metrics_keep_ended_s = 300;
  c->max_pending_per_identity = 64;
  c->max_concurrent_plans = 2;
  c->max_concurrent_plans_per_identity = 1;
  c->max_streams_per_identity = 64;
  c->max_watch_bytes_per_stream = 4 << 20;
  c->max_watch_bytes_total = 256 << 20;
}

/* "host:port" with a non-empty host ("[v6]" bracketed) and a decimal port
 * 0..65535. */
static bool address_ok(const char *a) {
  const char *colon = strrchr(a, ':');
  if (!colon || colon == a)
    return false;
  size_t host_len = (size_t)(colon - a);
  if (a[0] == '[') {
    if (host_len < 3 || colon[-1] != ']')
      return false;
  } else if (memchr(a, ':', host_len)) {
    return false; /* an unbracketed IPv6 address is ambiguous */
  }
  for (const char *c = a; c < colon; c++)
    if (*c == ' ' || *c == '\t' || *c == '/')
      return false;
  const char *port = colon + 1;
  size_t digits = strspn(port, "0123456789");
  return digits >= 1 && digits <= 5 && !port[digits] && atol(port) <= 65535;
}

/* The integer keys of limits: each its range and its field. */
static zb_err coord_limit(const zb_yaml_walk *w, coord_key k, const yaml_node_t *v, zb_coord_config *c) {
  const zb_yaml_int_range *range = k == CO_METRICS_KEEP  ? &METRICS_KEEP_RANGE
                                   : k == CO_WATCH_BYTES ? &WATCH_BYTES_RANGE
                                   : k == CO_WATCH_TOTAL ? &WATCH_TOTAL_RANGE
                                                         : &MAX_PENDING_RANGE;
  long long *field = k == CO_METRICS_KEEP  ? &c->metrics_keep_ended_s
                     : k == CO_MAX_PENDING ? &c->max_pending_per_identity
                     : k == CO_MAX_STREAMS ? &c->max_streams_per_identity
                     : k == CO_WATCH_BYTES ? &c->max_watch_bytes_per_stream
                                           : &c->max_watch_bytes_total;
  return zb_yaml_get_int(w, v, coord_keys[k], range, field);
}

static zb_err coord_value(const zb_yaml_walk *w, coord_key k, const yaml_node_t *v, zb_coord_config *c) {
  char buf[64];
  long long x;
  zb_err err;
  switch (k) {
  case CO_LISTEN:
  case CO_METRICS_LISTEN: {
    char *dst = k == CO_LISTEN ? c->listen : c->metrics_listen;
    if ((err = zb_yaml_get_string(w, v, coord_keys[k], dst, sizeof c->listen)))
      return err;
    if (!address_ok(dst))
      return zb_diag_set(w->diag, ZB_ERR_INVALID_ARG,
                         "line %d: key '%s': expected host:port with a port 0..65535, got %s",
                         zb_yaml_line(v), coord_keys[k], zb_yaml_describe(v, buf, sizeof buf));
    return ZB_OK;
  }
  case CO_DATA_DIR:
    if ((err = zb_yaml_get_string(w, v, "data_dir", c->data_dir, sizeof c->data_dir)))
      return err;
    if (!c->data_dir[0])
      return zb_diag_set(w->diag, ZB_ERR_INVALID_ARG, "line %d: key 'data_dir': must not be empty",
                         zb_yaml_line(v));
    return ZB_OK;
  case CO_HEARTBEAT:
    if ((err = zb_yaml_get_int(w, v, "heartbeat_timeout_ms", &HEARTBEAT_RANGE, &x)))
      return err;
    c->heartbeat_timeout_ms = (int)x;
    return ZB_OK;
  case CO_LOG_LEVEL:
    /* Checked before copying: an unknown level reads better as "not a level"
     * than as too long for the field. get_string reports the wrong types. */
    if (v->type != YAML_SCALAR_NODE || zb_yaml_is_null(v) || zb_log_level_parse(zb_yaml_text(v)) >= 0)
      return zb_yaml_get_string(w, v, "log_level", c->log_level, sizeof c->log_level);
    return zb_diag_set(w->diag, ZB_ERR_INVALID_ARG,
                       "line %d: key 'log_level': must be one of debug, info, warn, error, got %s",
                       zb_yaml_line(v), zb_yaml_describe(v, buf, sizeof buf));
  case CO_MAX_MESSAGE:
    if ((err = zb_yaml_get_int(w, v, "max_message_bytes", &MAX_MESSAGE_RANGE, &x)))
      return err;
    c->max_message_bytes = x;
    return ZB_OK;
  case CO_MAX_PLAN_OPS:
    if ((err = zb_yaml_get_int(w, v, "max_plan_ops", &MAX_PLAN_OPS_RANGE, &x)))
      return err;
    c->max_plan_ops = x;
    return ZB_OK;
  case CO_RETAIN_JOBS:
  case CO_RETAIN_S:
    if ((err = zb_yaml_get_int(w, v, coord_keys[k],
                               k == CO_RETAIN_JOBS ? &RETAIN_JOBS_RANGE : &RETAIN_S_RANGE, &x)))
      return err;
    *(k == CO_RETAIN_JOBS ? &c->retain_finished_jobs : &c->retain_finished_s) = x;
    return ZB_OK;
  case CO_PLANS:
  case CO_PLANS_PER_ID:
    if ((err = zb_yaml_get_int(w, v, coord_keys[k], &PLANS_RANGE, &x)))
      return err;
    *(k == CO_PLANS ? &c->max_concurrent_plans : &c->max_concurrent_plans_per_identity) = (int)x;
    return ZB_OK;
  case CO_METRICS_KEEP:
  case CO_MAX_PENDING:
  case CO_MAX_STREAMS:
  case CO_WATCH_BYTES:
  case CO_WATCH_TOTAL: return coord_limit(w, k, v, c);
  case CO_TLS_CA:
  case CO_TLS_CERT:
  case CO_TLS_KEY: {
    char *dst = k == CO_TLS_CA ? c->tls.ca : k == CO_TLS_CERT ? c->tls.cert : c->tls.key;
    return zb_yaml_get_string(w, v, coord_keys[k], dst, sizeof c->tls.ca);
  }
  case CO_COUNT_: break;
  }
  return ZB_ERR_PARSE;
}

/* An empty document (say, every line commented out) changes nothing: all
 * keys are optional, so it is a valid config. */
zb_err zb_coord_config_parse(const char *yaml, size_t len, zb_coord_config *out, zb_diag *diag) {
  zb_coord_config c = *out; /* parsed aside: *out changes only on success */
  yaml_document_t doc;
  yaml_node_t *root = NULL;
  char known[640], what[700];
  int seen[CO_COUNT_] = {0};
  zb_err err = zb_yaml_load(yaml, len, &doc, &root, diag);
  if (err)
    return err;
  zb_yaml_walk w = {&doc, diag};
  if (!root)
    goto cleanup;
  zb_yaml_join_names(coord_keys, CO_COUNT_, known, sizeof known);
  snprintf(what, sizeof what, "a mapping of keys (%s)", known);
  if ((err = zb_yaml_want_root_mapping(&w, root, what)))
    goto cleanup;
  for (const yaml_node_pair_t *pair = root->data.mapping.pairs.start; pair < root->data.mapping.pairs.top;
       pair++) {
    int k = -1; /* set by map_key on success; gcc -O2 cannot see that */
    if ((err = zb_yaml_map_key(&w, zb_yaml_node_at(&w, pair->key), coord_keys, CO_COUNT_, "", seen, &k)) ||
        (err = coord_value(&w, (coord_key)k, zb_yaml_node_at(&w, pair->value), &c)))
      goto cleanup;
  }
  if (c.max_watch_bytes_total < c.max_watch_bytes_per_stream) {
    err = zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                      "key 'max_watch_bytes_total': %lld is less than max_watch_bytes_per_stream (%lld): "
                      "one watcher could never be sent what its own budget allows",
                      c.max_watch_bytes_total, c.max_watch_bytes_per_stream);
    goto cleanup;
  }
  *out = c;
cleanup:
  yaml_document_delete(&doc);
  return err;
}
