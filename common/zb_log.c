#include "zb_log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "zb_clock.h"

static atomic_int zb_log_level_now = ZB_LOG_INFO;
static char zb_log_name[64] = "zb";

static const char *const zb_log_names[] = {"debug", "info", "warn", "error"};

void zb_log_init(const char *name, zb_log_level level) {
  snprintf(zb_log_name, sizeof zb_log_name, "%s", name);
  zb_log_set_level(level);
}

void zb_log_set_level(zb_log_level level) {
  atomic_store(&zb_log_level_now, (int)level);
}
zb_log_level zb_log_get_level(void) {
  return (zb_log_level)atomic_load(&zb_log_level_now);
}

int zb_log_level_parse(const char *s) {
  for (int k = 0; k < 4; k++)
    if (strcmp(s, zb_log_names[k]) == 0)
      return k;
  return -1;
}

const char *zb_log_level_name(zb_log_level level) {
  return level >= ZB_LOG_DEBUG && level <= ZB_LOG_ERROR ? zb_log_names[level] : "?";
}

void zb_log(zb_log_level level, const char *fmt, ...) {
  if ((int)level < atomic_load(&zb_log_level_now))
    return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int64_t ms = zb_clock_unix_ms();
  time_t sec = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&sec, &tm);
  static const char *const tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
  fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: %s\n", tm.tm_year + 1900, tm.tm_mon + 1,
          tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)(ms % 1000), tags[level], zb_log_name, msg);
}
