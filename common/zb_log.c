/* zb_log.c — one line per event on stderr, in logfmt (key=value) so that
 * zb's lines and gRPC's own (routed here) read and parse alike; under
 * systemd, when stderr is the journal ($JOURNAL_STREAM names it), each
 * line starts with its syslog priority "<N>" and leaves the timestamp to
 * journald, so `journalctl -p err` selects the errors (docs/operations.md,
 * Logs). */
#include "zb_log.h"

#include <grpc/support/log.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "zb_clock.h"

static atomic_int zb_log_level_now = ZB_LOG_INFO;
static char zb_log_name[64] = "zb";
static bool zb_log_journal; /* set once by zb_log_init, before the threads */

static const char *const zb_log_names[] = {"debug", "info", "warn", "error"};

/* Whether stderr is the journal stream $JOURNAL_STREAM ("DEV:INODE") names. */
static bool stderr_is_journal(void) {
  const char *js = getenv("JOURNAL_STREAM");
  unsigned long long dev, ino;
  struct stat st;
  return js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(2, &st) == 0 &&
         (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* gRPC's own lines, in ours: its ERROR, INFO and DEBUG severities. */
static void grpc_line(gpr_log_func_args *a) {
  zb_log_level level = a->severity == GPR_LOG_SEVERITY_ERROR  ? ZB_LOG_ERROR
                       : a->severity == GPR_LOG_SEVERITY_INFO ? ZB_LOG_INFO
                                                              : ZB_LOG_DEBUG;
  const char *file = a->file ? strrchr(a->file, '/') : NULL;
  zb_log_src(level, "grpc", "%s (%s:%d)", a->message, file ? file + 1 : a->file ? a->file : "?", a->line);
}

void zb_log_init(const char *name, zb_log_level level) {
  snprintf(zb_log_name, sizeof zb_log_name, "%s", name);
  zb_log_journal = stderr_is_journal();
  zb_log_set_level(level);
  gpr_set_log_function(grpc_line);
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

/* msg as a logfmt value: quoted, with '"' and '\' escaped and control
 * characters (a newline in a peer's message) written as \n or \xHH. */
static void quote(const char *msg, char *out, size_t cap) {
  size_t n = 0;
  out[n++] = '"';
  for (const unsigned char *p = (const unsigned char *)msg; *p && n + 6 < cap; p++) {
    if (*p == '"' || *p == '\\') {
      out[n++] = '\\';
      out[n++] = (char)*p;
    } else if (*p == '\n') {
      out[n++] = '\\';
      out[n++] = 'n';
    } else if (*p < 0x20 || *p == 0x7f) {
      n += (size_t)snprintf(out + n, cap - n, "\\x%02x", *p);
    } else {
      out[n++] = (char)*p;
    }
  }
  out[n++] = '"';
  out[n] = 0;
}

static void vlog(zb_log_level level, const char *src, const char *fmt, va_list ap) {
  if ((int)level < atomic_load(&zb_log_level_now))
    return;
  char msg[1024], quoted[2200], name[80];
  vsnprintf(msg, sizeof msg, fmt, ap);
  quote(msg, quoted, sizeof quoted);
  quote(src ? src : zb_log_name, name, sizeof name);
  if (zb_log_journal) {
    static const int priority[] = {7, 6, 4, 3}; /* syslog: debug, info, warning, err */
    fprintf(stderr, "<%d>level=%s src=%s msg=%s\n", priority[level], zb_log_names[level], name, quoted);
    return;
  }
  int64_t ms = zb_clock_unix_ms();
  time_t sec = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&sec, &tm);
  fprintf(stderr, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s src=%s msg=%s\n", tm.tm_year + 1900,
          tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)(ms % 1000), zb_log_names[level],
          name, quoted);
}

void zb_log(zb_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(level, NULL, fmt, ap);
  va_end(ap);
}

void zb_log_src(zb_log_level level, const char *src, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(level, src, fmt, ap);
  va_end(ap);
}
