/* test_coord_config.c — the coordinator's config from real YAML text:
 * defaults, every key, layering (defaults, file, flags), and each class of
 * error with its zb_err, the key it names and the line it points at; a
 * failed parse leaves the config unchanged. */
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>

#include "coord_config.h"
#include "zbtest.h"

/* true when msg holds every substring of the NULL-terminated list ap;
 * otherwise prints the first one missing. */
static bool has_all(const char *msg, va_list ap) {
  for (const char *want = va_arg(ap, const char *); want; want = va_arg(ap, const char *))
    if (!strstr(msg, want)) {
      fprintf(stderr, "    message lacks \"%s\": %s\n", want, msg);
      return false;
    }
  return true;
}

/* Parses yaml over a default coordinator config expecting `want` and the
 * substrings; the config must come back byte for byte unchanged. */
static bool coord_fails(const char *yaml, zb_err want, ...) {
  zb_coord_config c, before;
  zb_coord_config_default(&c);
  before = c;
  zb_diag d = {{0}};
  zb_err got = zb_coord_config_parse(yaml, strlen(yaml), &c, &d);
  bool ok = got == want;
  if (!ok)
    fprintf(stderr, "    got %s (%d), want %s; message: %s\n", zb_strerror(got), got, zb_strerror(want),
            d.msg);
  va_list ap;
  va_start(ap, want);
  ok = has_all(d.msg, ap) && ok;
  va_end(ap);
  if (memcmp(&c, &before, sizeof c) != 0) {
    fprintf(stderr, "    config changed by a failed parse\n");
    ok = false;
  }
  if (!ok)
    fprintf(stderr, "    input:\n%s\n", yaml);
  return ok;
}

/* ---- coordinator config -------------------------------------------------- */

static void test_coord_defaults_and_full(void) {
  zb_coord_config c;
  zb_coord_config_default(&c);
  CHECK_STREQ(c.listen, "127.0.0.1:7070");
  CHECK_STREQ(c.metrics_listen, "127.0.0.1:9464");
  CHECK_STREQ(c.data_dir, "/var/lib/zb");
  CHECK_EQ(c.heartbeat_timeout_ms, 5000);
  CHECK_STREQ(c.log_level, "info");
  CHECK_EQ(c.max_message_bytes, 16777216);

  const char *yaml = "listen: 0.0.0.0:0\n"
                     "metrics_listen: '[::1]:9100'\n"
                     "data_dir: /tmp/zb state\n"
                     "heartbeat_timeout_ms: 100\n"
                     "log_level: debug\n"
                     "max_message_bytes: 1073741824\n"
                     "max_plan_ops: 5000\n"
                     "retain_finished_jobs: 7\n"
                     "retain_finished_s: 60\n"
                     "max_pending_per_identity: 5\n"
                     "max_streams_per_identity: 3\n"
                     "max_watch_bytes_per_stream: 65536\n"
                     "max_watch_bytes_total: 1048576\n"
                     "tls_ca: /etc/zb/ca.pem\n"
                     "tls_cert: /etc/zb/coordinator.pem\n"
                     "tls_key: /etc/zb/coordinator.key\n";
  CHECK_EQ(c.max_plan_ops, 1 << 24);
  CHECK_EQ(c.max_pending_per_identity, 64);
  CHECK_EQ(c.max_streams_per_identity, 64);
  CHECK_EQ(c.max_watch_bytes_per_stream, 4 << 20);
  CHECK_EQ(c.max_watch_bytes_total, 256 << 20);
  CHECK(!zb_tls_files_set(&c.tls));
  zb_diag d = {{0}};
  CHECK_EQ(zb_coord_config_parse(yaml, strlen(yaml), &c, &d), ZB_OK);
  CHECK_EQ(c.max_plan_ops, 5000);
  CHECK_EQ(c.retain_finished_jobs, 7);
  CHECK_EQ(c.retain_finished_s, 60);
  CHECK_EQ(c.max_pending_per_identity, 5);
  CHECK_EQ(c.max_streams_per_identity, 3);
  CHECK_EQ(c.max_watch_bytes_per_stream, 65536);
  CHECK_EQ(c.max_watch_bytes_total, 1048576);
  CHECK_STREQ(c.tls.ca, "/etc/zb/ca.pem");
  CHECK_STREQ(c.tls.cert, "/etc/zb/coordinator.pem");
  CHECK_STREQ(c.tls.key, "/etc/zb/coordinator.key");
  CHECK_STREQ(c.listen, "0.0.0.0:0");
  CHECK_STREQ(c.metrics_listen, "[::1]:9100");
  CHECK_STREQ(c.data_dir, "/tmp/zb state");
  CHECK_EQ(c.heartbeat_timeout_ms, 100);
  CHECK_STREQ(c.log_level, "debug");
  CHECK_EQ(c.max_message_bytes, 1073741824);
}

/* Layering: a file sets only what it names; an empty one sets nothing. */
static void test_coord_layering(void) {
  zb_coord_config c;
  zb_coord_config_default(&c);
  zb_diag d = {{0}};
  const char *yaml = "# overrides\nlog_level: warn\nheartbeat_timeout_ms: 600000\n";
  CHECK_EQ(zb_coord_config_parse(yaml, strlen(yaml), &c, &d), ZB_OK);
  CHECK_STREQ(c.log_level, "warn");
  CHECK_EQ(c.heartbeat_timeout_ms, 600000);
  CHECK_STREQ(c.listen, "127.0.0.1:7070");
  CHECK_STREQ(c.data_dir, "/var/lib/zb");
  yaml = "listen: example.org:8080\n";
  CHECK_EQ(zb_coord_config_parse(yaml, strlen(yaml), &c, &d), ZB_OK);
  CHECK_STREQ(c.listen, "example.org:8080");
  CHECK_STREQ(c.log_level, "warn");
  zb_coord_config before = c;
  yaml = "# listen: 1.2.3.4:1\n";
  CHECK_EQ(zb_coord_config_parse(yaml, strlen(yaml), &c, &d), ZB_OK);
  CHECK_EQ(zb_coord_config_parse("", 0, &c, &d), ZB_OK);
  CHECK(memcmp(&c, &before, sizeof c) == 0);
}

static void test_coord_invalid_leaves_unchanged(void) {
  CHECK(coord_fails("max_plan_ops: 10\n", ZB_ERR_INVALID_ARG, "max_plan_ops", NULL));
  CHECK(coord_fails("retain_finished_jobs: 0\n", ZB_ERR_INVALID_ARG, "retain_finished_jobs", NULL));
  CHECK(coord_fails("max_pending_per_identity: 0\n", ZB_ERR_INVALID_ARG, "max_pending_per_identity", NULL));
  CHECK(coord_fails("retain_finished_s: 0\n", ZB_ERR_INVALID_ARG, "retain_finished_s", NULL));
  CHECK(coord_fails("max_streams_per_identity: 0\n", ZB_ERR_INVALID_ARG, "max_streams_per_identity", NULL));
  CHECK(coord_fails("max_watch_bytes_per_stream: 1000\n", ZB_ERR_INVALID_ARG, "max_watch_bytes_per_stream",
                    "between 65536 and", NULL));
  CHECK(coord_fails("max_watch_bytes_total: 1000\n", ZB_ERR_INVALID_ARG, "max_watch_bytes_total", NULL));
  /* the total below one stream's budget: no watcher could get what its own allows */
  CHECK(coord_fails("max_watch_bytes_per_stream: 8388608\nmax_watch_bytes_total: 4194304\n",
                    ZB_ERR_INVALID_ARG, "'max_watch_bytes_total'", "less than max_watch_bytes_per_stream",
                    NULL));
  CHECK(coord_fails("tls_ca: [a, b]\n", ZB_ERR_PARSE, "tls_ca", NULL));
  /* Valid keys before the bad one: nothing of them may stick. */
  CHECK(coord_fails("log_level: debug\nlisten: 10.0.0.1:1\nheartbeat_timeout_ms: 50\n", ZB_ERR_INVALID_ARG,
                    "line 3", "'heartbeat_timeout_ms'", "between 100 and 600000", NULL));
  CHECK(coord_fails("heartbeat_timeout_ms: 600001\n", ZB_ERR_INVALID_ARG, "line 1", NULL));
  CHECK(coord_fails("log_level: debug\nheartbeat_timeout_ms: fast\n", ZB_ERR_PARSE, "line 2",
                    "'heartbeat_timeout_ms'", "'fast'", NULL));
  CHECK(coord_fails("heartbeat_timeout_ms: -5\n", ZB_ERR_PARSE, "line 1", NULL));
  CHECK(coord_fails("listen: localhost\n", ZB_ERR_INVALID_ARG, "line 1", "'listen'", "host:port", NULL));
  CHECK(coord_fails("listen: localhost:70000\n", ZB_ERR_INVALID_ARG, "line 1", "'listen'", NULL));
  CHECK(coord_fails("listen: ':7070'\n", ZB_ERR_INVALID_ARG, "'listen'", NULL));
  CHECK(coord_fails("listen: \"\"\n", ZB_ERR_INVALID_ARG, "'listen'", NULL));
  CHECK(coord_fails("listen: localhost:80x\n", ZB_ERR_INVALID_ARG, "'listen'", NULL));
  CHECK(coord_fails("data_dir: /x\nmetrics_listen: ::1:9100\n", ZB_ERR_INVALID_ARG, "line 2",
                    "'metrics_listen'", NULL));
  CHECK(coord_fails("listen: 1.2.3.4:5\nlog_level: verbose\n", ZB_ERR_INVALID_ARG, "line 2", "'log_level'",
                    "debug, info, warn, error", NULL));
  CHECK(coord_fails("log_level: [info]\n", ZB_ERR_PARSE, "line 1", "'log_level'", NULL));
  CHECK(coord_fails("max_message_bytes: 1024\n", ZB_ERR_INVALID_ARG, "line 1", "'max_message_bytes'", "4096",
                    NULL));
  CHECK(coord_fails("max_message_bytes: 4k\n", ZB_ERR_PARSE, "line 1", "'max_message_bytes'", NULL));
  CHECK(coord_fails("data_dir: ''\n", ZB_ERR_INVALID_ARG, "line 1", "'data_dir'", "empty", NULL));
  CHECK(coord_fails("data_dir:\n", ZB_ERR_PARSE, "line 1", "'data_dir'", NULL));
  CHECK(coord_fails(
      "listen: 1.2.3.4:5\nlistn: 1.2.3.4:6\n", ZB_ERR_PARSE, "line 2", "unknown key 'listn'",
      "known: listen, metrics_listen, data_dir, heartbeat_timeout_ms, log_level, max_message_bytes", NULL));
  CHECK(coord_fails("log_level: warn\nlog_level: error\n", ZB_ERR_PARSE, "line 2", "given twice", NULL));
  CHECK(coord_fails("- listen\n", ZB_ERR_PARSE, "line 1", "expected a mapping", NULL));
  CHECK(coord_fails("log_level: warn\nlisten: [1.2.3.4:5\n", ZB_ERR_PARSE, "line 3", "YAML syntax error",
                    NULL));
}

ZBT_MAIN(ZBT(test_coord_defaults_and_full), ZBT(test_coord_layering),
         ZBT(test_coord_invalid_leaves_unchanged))
