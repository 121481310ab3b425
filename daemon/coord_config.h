/* coord_config.h — zb-coordinator's settings: their defaults and the YAML
 * config file, read strictly (zb_yaml.h): an unknown key, a wrong type or
 * a value out of range is an error naming the key and its line. The
 * command line's flags go through the same reader, as one YAML line each
 * (main.c). zb_coord_config owns nothing.
 */
#ifndef ZB_COORD_CONFIG_H
#define ZB_COORD_CONFIG_H

#include <stddef.h>

#include "zb_err.h"
#include "zb_tls.h"

/* The coordinator's config file (deploy/zb-coordinator.yaml):
 *   listen: 127.0.0.1:7070            # gRPC address (port 0: any free port)
 *   metrics_listen: 127.0.0.1:9464    # Prometheus /metrics HTTP address (port 0: any)
 *   data_dir: /var/lib/zb             # SQLite database and state
 *   heartbeat_timeout_ms: 5000        # a worker silent this long is dead (100..600000)
 *   log_level: info                   # debug, info, warn, error
 *   max_message_bytes: 16777216       # gRPC receive limit (4096..1 GiB)
 *   max_plan_ops: 16777216            # largest plan admitted: ranks x chunks x
 *                                     #   microbatches x 3 compute ops (1000..2^31)
 *   metrics_keep_ended_s: 300         # a finished job's series stay on /metrics this long (1..86400)
 *   max_pending_per_identity: 64      # jobs one certificate's name may have waiting (1..10^6)
 *   max_concurrent_plans: 2           # plans made at once, off the loop (1..4)
 *   max_concurrent_plans_per_identity: 1  # of them one identity's; its others wait (1..4)
 *   max_streams_per_identity: 64      # WatchJob streams one identity may have open (1..10^6)
 *   max_watch_bytes_per_stream: 4194304  # queued for one watcher before it is cut (64 KiB..1 GiB)
 *   max_watch_bytes_total: 268435456  # queued for all watchers together (1 MiB..1 TiB, at
 *                                     #   least max_watch_bytes_per_stream)
 *   retain_finished_jobs: 1000        # finished jobs kept, newest first (1..10^7)
 *   retain_finished_s: 604800         # and for at most this long (1..10 years)
 *   tls_ca: /etc/zb/ca.pem            # mutual TLS (all three, or none:
 *   tls_cert: /etc/zb/coordinator.pem #   insecure mode, loopback
 *   tls_key: /etc/zb/coordinator.key  #   development only)
 * Every key is optional; unknown keys are errors. */
typedef struct zb_coord_config {
  char listen[128];
  char metrics_listen[128];
  char data_dir[512];
  int heartbeat_timeout_ms;
  char log_level[8];
  long long max_message_bytes;
  long long max_plan_ops;
  long long retain_finished_jobs, retain_finished_s;
  long long metrics_keep_ended_s;
  long long max_pending_per_identity;
  int max_concurrent_plans, max_concurrent_plans_per_identity;
  long long max_streams_per_identity;
  long long max_watch_bytes_per_stream, max_watch_bytes_total;
  zb_tls_files tls;
} zb_coord_config;

void zb_coord_config_default(zb_coord_config *c);
/* Parses YAML over the values already in *out (so defaults, then file,
 * then command line can be layered by the caller). On failure *out is
 * unchanged. */
zb_err zb_coord_config_parse(const char *yaml, size_t len, zb_coord_config *out, zb_diag *diag);

#endif
