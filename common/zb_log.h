/* zb_log.h — leveled logging to stderr for the daemons and zbctl.
 *
 * One process-wide level, set once at start-up (and on SIGHUP) from the
 * loop thread; lines are written with one fprintf each so concurrent
 * threads do not interleave within a line. Format (logfmt):
 *   ts=2026-11-23T06:00:00.123Z level=info src="coordinator" msg="job j-3 RUNNING: ..."
 * and, when stderr is the journal, "<6>level=info src=... msg=..." (the
 * syslog priority first, no timestamp). gRPC's own lines come through here
 * with src="grpc" once zb_log_init ran.
 */
#ifndef ZB_LOG_H
#define ZB_LOG_H

typedef enum zb_log_level {
  ZB_LOG_DEBUG = 0,
  ZB_LOG_INFO = 1,
  ZB_LOG_WARN = 2,
  ZB_LOG_ERROR = 3,
} zb_log_level;

/* Sets the least severe level that is printed, and the name each line
 * carries ("coordinator", "worker 3", ...; copied). */
void zb_log_init(const char *name, zb_log_level level);
void zb_log_set_level(zb_log_level level);
zb_log_level zb_log_get_level(void);
/* Parses "debug", "info", "warn" or "error"; -1 when unknown. */
int zb_log_level_parse(const char *s);
const char *zb_log_level_name(zb_log_level level);

void zb_log(zb_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A line on behalf of another source (src="grpc"). */
void zb_log_src(zb_log_level level, const char *src, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ZB_DEBUG(...) zb_log(ZB_LOG_DEBUG, __VA_ARGS__)
#define ZB_INFO(...) zb_log(ZB_LOG_INFO, __VA_ARGS__)
#define ZB_WARN(...) zb_log(ZB_LOG_WARN, __VA_ARGS__)
#define ZB_ERROR(...) zb_log(ZB_LOG_ERROR, __VA_ARGS__)

#endif
