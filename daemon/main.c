/* zb-coordinator: config (defaults, then the YAML file, then flags), the
 * store, the gRPC server and the metrics endpoint on one libuv loop.
 * SIGTERM/SIGINT drain and exit 0; SIGHUP re-reads the config file and
 * applies what can change while running (log level, heartbeat timeout). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coordinator.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_file.h"
#include "zb_log.h"
#include "zb_sd.h"

#ifndef ZB_VERSION
#define ZB_VERSION "unknown"
#endif

static const char usage_text[] =
    "usage: zb-coordinator [--config FILE] [--listen ADDR] [--metrics-listen ADDR]\n"
    "                      [--data-dir DIR] [--heartbeat-timeout-ms N] [--log-level L]\n"
    "                      [--max-message-bytes N] [--max-plan-ops N]\n"
    "                      [--retain-finished-jobs N] [--retain-finished-s N]\n"
    "                      [--metrics-keep-ended-s N]\n"
    "                      [--tls-ca FILE --tls-cert FILE --tls-key FILE]\n"
    "                      [--port-file FILE] [--version] [--help]\n"
    "\n"
    "Plans pipeline schedules, assigns ranks to attached zb-workers, dispatches\n"
    "their action lists, gathers their reports and keeps jobs in SQLite.\n"
    "\n"
    "  --config FILE            YAML config (keys: listen, metrics_listen, data_dir,\n"
    "                           heartbeat_timeout_ms, log_level, max_message_bytes,\n"
    "                           max_plan_ops, retain_finished_jobs, retain_finished_s,\n"
    "                           metrics_keep_ended_s, max_pending_per_identity,\n"
    "                           max_concurrent_plans,\n"
    "                           max_concurrent_plans_per_identity,\n"
    "                           max_streams_per_identity, max_watch_bytes_per_stream,\n"
    "                           max_watch_bytes_total, tls_ca, tls_cert, tls_key)\n"
    "  --listen ADDR            gRPC address (default 127.0.0.1:7070; port 0: any)\n"
    "  --metrics-listen ADDR    Prometheus /metrics address (default 127.0.0.1:9464)\n"
    "  --data-dir DIR           where zb.db lives (default /var/lib/zb; created)\n"
    "  --heartbeat-timeout-ms N a worker silent this long is dead (default 5000)\n"
    "  --log-level L            debug, info, warn, error (default info)\n"
    "  --max-message-bytes N    gRPC message limit (default 16777216)\n"
    "  --max-plan-ops N         largest plan admitted, in compute ops: ranks x chunks x\n"
    "                           microbatches x 3 (default 16777216), checked before planning\n"
    "  --retain-finished-jobs N keep the newest N finished jobs (default 1000) and\n"
    "  --retain-finished-s N      none older than N seconds (default 604800, 7 days);\n"
    "                             the rest are pruned with their events\n"
    "  --metrics-keep-ended-s N a finished job's series stay on /metrics N seconds\n"
    "                           (default 300), then leave it\n"
    "  --tls-ca FILE            mutual TLS: the CA that signs every party's certificate;\n"
    "  --tls-cert FILE            this coordinator's certificate and\n"
    "  --tls-key FILE             its key (all three, or none: insecure mode, every\n"
    "                             caller trusted as admin; for loopback development)\n"
    "  --port-file FILE         write 'GRPC_PORT METRICS_PORT' there once listening\n"
    "\n"
    "Flags override the config file. Logs go to stderr. SIGTERM drains and\n"
    "exits 0; SIGHUP reloads log_level and heartbeat_timeout_ms from --config\n"
    "(those given as flags keep the flags' values).\n";

static bool load_config_file(const char *path, zb_coord_config *cfg) {
  uint8_t *text;
  size_t len;
  zb_diag d;
  if (zb_file_slurp("config", path, &text, &len, &d) != ZB_OK) {
    fprintf(stderr, "zb-coordinator: %s\n", d.msg);
    return false;
  }
  zb_err err = zb_coord_config_parse((const char *)text, len, cfg, &d);
  free(text);
  if (err) {
    fprintf(stderr, "zb-coordinator: %s: %s\n", path, d.msg);
    return false;
  }
  return true;
}

static int mkdir_p(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s", dir);
  for (char *p = path + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return -1;
      *p = '/';
    }
  return mkdir(path, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Under systemd with WatchdogSec= (docs/operations.md, systemd): a
 * keep-alive from the tick, at twice the rate asked, so a loop that stops
 * turning stops them and the service manager restarts the daemon. */
static void watchdog_ping(coord *co) {
  int64_t now = zb_clock_unix_ms();
  if (!co->watchdog_ms || now - co->last_watchdog_ms < co->watchdog_ms / 2)
    return;
  co->last_watchdog_ms = now;
  int running = 0;
  for (const coord_job *j = co->jobs; j; j = j->next)
    running += j->row.state == ZB_JOB_RUNNING;
  zb_sd_notifyf("WATCHDOG=1\nSTATUS=serving: %d workers attached, %d jobs running%s", workers_attached(co),
                running, co->store_failing ? "; the job store takes no writes" : "");
}

static void on_tick(uv_timer_t *t) {
  coord_tick(t->data);
  coord_metrics_sweep(t->data);
  watchdog_ping(t->data);
}

static void on_rpc_down(void *arg) {
  coord *co = arg;
  coord_metrics_detach_loop(co);
  uv_close((uv_handle_t *)&co->tick, NULL);
  uv_close((uv_handle_t *)&co->sigterm, NULL);
  uv_close((uv_handle_t *)&co->sigint, NULL);
  uv_close((uv_handle_t *)&co->sighup, NULL);
}

static void on_stop_signal(uv_signal_t *h, int signum) {
  coord *co = h->data;
  if (co->stopping)
    return;
  co->stopping = true;
  zb_sd_notify("STOPPING=1");
  ZB_INFO("signal %d: draining (workers run on and re-attach to the next coordinator, which takes their jobs "
          "back)",
          signum);
  zb_rpc_server_shutdown(co->rpc, on_rpc_down, co);
}

static void on_hup(uv_signal_t *h, int signum) {
  (void)signum;
  coord *co = h->data;
  if (!co->config_path) {
    ZB_INFO("SIGHUP: no --config file to reload");
    return;
  }
  zb_sd_notify("RELOADING=1");
  zb_coord_config fresh = co->cfg;
  if (!load_config_file(co->config_path, &fresh)) {
    ZB_WARN("SIGHUP: keeping the running config");
    zb_sd_notify("READY=1\nSTATUS=serving; the reloaded config was refused (see the log)");
    return;
  }
  if (!co->heartbeat_flag)
    co->cfg.heartbeat_timeout_ms = fresh.heartbeat_timeout_ms;
  if (!co->log_level_flag)
    snprintf(co->cfg.log_level, sizeof co->cfg.log_level, "%s", fresh.log_level);
  zb_log_set_level((zb_log_level)zb_log_level_parse(co->cfg.log_level));
  ZB_INFO("SIGHUP: reloaded log_level=%s%s heartbeat_timeout_ms=%d%s (addresses and data_dir need a restart)",
          co->cfg.log_level, co->log_level_flag ? " (flag)" : "", co->cfg.heartbeat_timeout_ms,
          co->heartbeat_flag ? " (flag)" : "");
  zb_sd_notify("READY=1");
}

/* What the command line sets beside the config's keys. */
typedef struct coord_args {
  const char *config_path, *port_file;
  bool heartbeat_flag, log_level_flag; /* SIGHUP keeps these flags' values */
} coord_args;

/* The --config FILE among the arguments (the last one given), found before
 * getopt runs so that the file can be read first and the flags override
 * it. */
static const char *find_config_path(int argc, char **argv) {
  const char *config_path = NULL;
  for (int k = 1; k < argc; k++)
    if (strcmp(argv[k], "--config") == 0 && k + 1 < argc)
      config_path = argv[k + 1];
    else if (strncmp(argv[k], "--config=", 9) == 0)
      config_path = argv[k] + 9;
  return config_path;
}

/* The flags over *cfg. Each goes through the same checks as the file, as a
 * YAML line. Returns -1 to go on, else the exit status (0 after --help and
 * --version, 2 for a bad flag). */
static int parse_flags(int argc, char **argv, zb_coord_config *cfg, coord_args *args) {
  static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                       {"listen", required_argument, NULL, 'l'},
                                       {"metrics-listen", required_argument, NULL, 'm'},
                                       {"data-dir", required_argument, NULL, 'd'},
                                       {"heartbeat-timeout-ms", required_argument, NULL, 't'},
                                       {"log-level", required_argument, NULL, 'L'},
                                       {"max-message-bytes", required_argument, NULL, 'M'},
                                       {"port-file", required_argument, NULL, 'p'},
                                       {"max-plan-ops", required_argument, NULL, 'O'},
                                       {"retain-finished-jobs", required_argument, NULL, 'R'},
                                       {"retain-finished-s", required_argument, NULL, 'S'},
                                       {"metrics-keep-ended-s", required_argument, NULL, 'E'},
                                       {"tls-ca", required_argument, NULL, 'A'},
                                       {"tls-cert", required_argument, NULL, 'C'},
                                       {"tls-key", required_argument, NULL, 'K'},
                                       {"version", no_argument, NULL, 'V'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  char yaml[1024];
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    const char *key = NULL;
    switch (c) {
    case 'c': continue;
    case 'l': key = "listen"; break;
    case 'm': key = "metrics_listen"; break;
    case 'd': key = "data_dir"; break;
    case 't':
      key = "heartbeat_timeout_ms";
      args->heartbeat_flag = true;
      break;
    case 'L':
      key = "log_level";
      args->log_level_flag = true;
      break;
    case 'M': key = "max_message_bytes"; break;
    case 'p': args->port_file = optarg; continue;
    case 'O': key = "max_plan_ops"; break;
    case 'R': key = "retain_finished_jobs"; break;
    case 'S': key = "retain_finished_s"; break;
    case 'E': key = "metrics_keep_ended_s"; break;
    case 'A': key = "tls_ca"; break;
    case 'C': key = "tls_cert"; break;
    case 'K': key = "tls_key"; break;
    case 'V': printf("zb-coordinator %s\n", ZB_VERSION); return 0;
    case 'h': fputs(usage_text, stdout); return 0;
    default: fputs(usage_text, stderr); return 2;
    }
    snprintf(yaml, sizeof yaml, "%s: \"%s\"\n", key, optarg);
    if (strchr("tMORSE", c))
      snprintf(yaml, sizeof yaml, "%s: %s\n", key, optarg);
    zb_diag d;
    if (zb_coord_config_parse(yaml, strlen(yaml), cfg, &d) != ZB_OK) {
      fprintf(stderr, "zb-coordinator: --%s: %s\n", key, d.msg);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "zb-coordinator: unexpected argument '%s'\n%s", argv[optind], usage_text);
    return 2;
  }
  return -1;
}

/* The config: defaults, then the --config file, then the flags. Returns
 * -1 to go on, else the exit status. */
static int load_config(int argc, char **argv, zb_coord_config *cfg, coord_args *args) {
  zb_coord_config_default(cfg);
  args->config_path = find_config_path(argc, argv);
  if (args->config_path && !load_config_file(args->config_path, cfg))
    return 2;
  return parse_flags(argc, argv, cfg, args);
}

/* Loads the jobs, then starts the metrics endpoint and the gRPC server and
 * writes the port file. On failure (logged) the caller cleans up. */
static bool start_serving(coord *co, const char *port_file) {
  zb_diag d;
  if (coord_load(co, &d) != ZB_OK) {
    ZB_ERROR("%s", d.msg);
    return false;
  }
  if (coord_metrics_start(co, &d) != ZB_OK) {
    ZB_ERROR("%s", d.msg);
    return false;
  }
  if (zb_tls_load(&co->cfg.tls, &co->tls, &d) != ZB_OK) {
    ZB_ERROR("%s", d.msg);
    return false;
  }
  if (zb_rpc_server_start(co->loop, co->cfg.listen, co->cfg.max_message_bytes, coord_methods, coord_n_methods,
                          co, co->tls, &co->rpc, &co->grpc_port, &d) != ZB_OK) {
    ZB_ERROR("listen: %s", d.msg);
    return false;
  }
  ZB_INFO("zb-coordinator %s: gRPC on port %d (%s), metrics on port %d, data in %s", ZB_VERSION,
          co->grpc_port, co->tls ? "mutual TLS" : "plaintext", co->metrics_port, co->cfg.data_dir);
  if (!co->tls)
    ZB_WARN(
        "INSECURE MODE: no TLS (tls_ca, tls_cert, tls_key unset): every caller on %s is trusted as an admin "
        "and a worker; for loopback development only (docs/operations.md, Security)",
        co->cfg.listen);
  if (port_file) {
    char ports[64];
    int n = snprintf(ports, sizeof ports, "%d %d\n", co->grpc_port, co->metrics_port);
    if (zb_file_write_atomic("--port-file", port_file, ports, (size_t)n, &d) != ZB_OK) {
      ZB_ERROR("%s", d.msg);
      co->stopping = true;
      zb_rpc_server_shutdown(co->rpc, NULL, NULL);
      uv_run(co->loop, UV_RUN_DEFAULT);
      return false;
    }
  }
  return true;
}

/* The tick timer and the signals, then the loop until a stop signal has
 * drained the server. */
static void run_loop(coord *co) {
  uv_timer_init(co->loop, &co->tick);
  co->tick.data = co;
  uv_timer_start(&co->tick, on_tick, COORD_TICK_MS, COORD_TICK_MS);
  co->last_tick_ms = zb_clock_unix_ms(); /* a stall before the first tick is a stall too */
  uv_signal_init(co->loop, &co->sigterm);
  uv_signal_init(co->loop, &co->sigint);
  uv_signal_init(co->loop, &co->sighup);
  co->sigterm.data = co->sigint.data = co->sighup.data = co;
  uv_signal_start(&co->sigterm, on_stop_signal, SIGTERM);
  uv_signal_start(&co->sigint, on_stop_signal, SIGINT);
  uv_signal_start(&co->sighup, on_hup, SIGHUP);
  co->watchdog_ms = (int64_t)(zb_sd_watchdog_usec() / 1000);
  zb_sd_notifyf("READY=1\nSTATUS=serving: gRPC on port %d, metrics on port %d", co->grpc_port,
                co->metrics_port);
  if (co->watchdog_ms)
    ZB_INFO("systemd watchdog: keep-alives every %lld ms", (long long)co->watchdog_ms / 2);
  uv_run(co->loop, UV_RUN_DEFAULT);
  ZB_INFO("stopped");
}

int main(int argc, char **argv) {
  zb_coord_config cfg;
  coord_args args = {0};
  int rc = load_config(argc, argv, &cfg, &args);
  if (rc >= 0)
    return rc;
  zb_log_init("coordinator", (zb_log_level)zb_log_level_parse(cfg.log_level));
  coord_raise_fd_limit();

  if (mkdir_p(cfg.data_dir) != 0) {
    ZB_ERROR("cannot create data_dir %s: %s", cfg.data_dir, strerror(errno));
    return 1;
  }
  coord co = {.cfg = cfg,
              .config_path = args.config_path,
              .heartbeat_flag = args.heartbeat_flag,
              .log_level_flag = args.log_level_flag};
  co.loop = uv_default_loop();
  char db[600];
  snprintf(db, sizeof db, "%s/zb.db", cfg.data_dir);
  zb_diag d;
  if (zb_store_open(db, &co.store, &d) != ZB_OK) {
    ZB_ERROR("%s", d.msg);
    return 1;
  }
  rc = 1;
  if (start_serving(&co, args.port_file)) {
    run_loop(&co);
    rc = 0;
  }
  coord_metrics_stop(&co);
  coord_free_state(&co);
  zb_tls_free(co.tls);
  zb_store_close(co.store);
  uv_loop_close(co.loop);
  return rc;
}
