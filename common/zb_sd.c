/* zb_sd.c — sd_notify(3)'s protocol (see zb_sd.h): one datagram of
 * newline-separated KEY=VALUE assignments to the AF_UNIX socket named by
 * $NOTIFY_SOCKET, a path or, with a leading '@', an abstract name. */
#include "zb_sd.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

bool zb_sd_notify(const char *state) {
  const char *path = getenv("NOTIFY_SOCKET");
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t len = path ? strlen(path) : 0;
  if (len < 2 || len >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@'))
    return false;
  memcpy(sa.sun_path, path, len);
  if (path[0] == '@')
    sa.sun_path[0] = 0; /* the abstract namespace */
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return false;
  socklen_t sa_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (path[0] == '/'));
  /* never blocks: a datagram socket whose reader has fallen behind would
   * otherwise hold the caller (a loop, a signal's handling) until it reads */
  ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&sa, sa_len);
  close(fd);
  return n == (ssize_t)strlen(state);
}

bool zb_sd_notifyf(const char *fmt, ...) {
  char state[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(state, sizeof state, fmt, ap);
  va_end(ap);
  return zb_sd_notify(state);
}

uint64_t zb_sd_watchdog_usec(void) {
  const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
  if (!usec || (pid && strtol(pid, NULL, 10) != (long)getpid()))
    return 0;
  char *end = NULL;
  unsigned long long v = strtoull(usec, &end, 10);
  return end && end != usec && !*end ? (uint64_t)v : 0;
}
