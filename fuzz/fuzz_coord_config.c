/* fuzz_coord_config.c — zb-coordinator's config reader
 * (daemon/coord_config.h): the YAML file an operator writes and the
 * command line's flags, each of which goes through the same reader. Any
 * bytes must give ZB_OK or an error with a message; on an error the
 * config is untouched (the reader promises it, main.c layers on it); on
 * success every value is one the coordinator can run with.
 */
#include <string.h>

#include "coord_config.h"
#include "fuzz.h"
#include "zb_log.h"

static void check_terminated(const char *s, size_t cap, const char *field) {
  FUZZ_CHECK(memchr(s, '\0', cap) != NULL, "%s is not NUL-terminated", field);
}

static void check_valid(const zb_coord_config *c) {
  check_terminated(c->listen, sizeof c->listen, "listen");
  check_terminated(c->metrics_listen, sizeof c->metrics_listen, "metrics_listen");
  check_terminated(c->data_dir, sizeof c->data_dir, "data_dir");
  check_terminated(c->log_level, sizeof c->log_level, "log_level");
  check_terminated(c->tls.ca, sizeof c->tls.ca, "tls_ca");
  check_terminated(c->tls.cert, sizeof c->tls.cert, "tls_cert");
  check_terminated(c->tls.key, sizeof c->tls.key, "tls_key");
  FUZZ_CHECK(c->data_dir[0], "data_dir is empty");
  FUZZ_CHECK(zb_log_level_parse(c->log_level) >= 0, "log_level '%s'", c->log_level);
  FUZZ_CHECK(c->heartbeat_timeout_ms >= 100 && c->heartbeat_timeout_ms <= 600000, "heartbeat_timeout_ms %d",
             c->heartbeat_timeout_ms);
  FUZZ_CHECK(c->max_message_bytes >= 4096 && c->max_message_bytes <= (1LL << 30), "max_message_bytes %lld",
             c->max_message_bytes);
  FUZZ_CHECK(c->max_plan_ops >= 1000 && c->max_plan_ops <= (1LL << 31), "max_plan_ops %lld", c->max_plan_ops);
  FUZZ_CHECK(c->max_streams_per_identity >= 1, "max_streams_per_identity %lld", c->max_streams_per_identity);
  FUZZ_CHECK(c->max_watch_bytes_per_stream >= (64 << 10) &&
                 c->max_watch_bytes_per_stream <= c->max_watch_bytes_total,
             "max_watch_bytes_per_stream %lld, max_watch_bytes_total %lld", c->max_watch_bytes_per_stream,
             c->max_watch_bytes_total);
  FUZZ_CHECK(strchr(c->listen, ':') && strchr(c->metrics_listen, ':'), "an address without a port");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  zb_coord_config c, before;
  zb_coord_config_default(&c);
  before = c;
  zb_diag d = {{0}};
  zb_err err = zb_coord_config_parse((const char *)data, size, &c, &d);
  if (err != ZB_OK) {
    FUZZ_CHECK(d.msg[0], "error %d without a message", (int)err);
    FUZZ_CHECK(memcmp(&c, &before, sizeof c) == 0, "a failed parse changed the config (%s)", d.msg);
    return 0;
  }
  check_valid(&c);
  return 0;
}
