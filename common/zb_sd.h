/* zb_sd.h — the service manager's notification protocol (sd_notify(3)),
 * written directly on its datagram socket so the daemons need no
 * libsystemd: readiness, reloading, stopping, a status line and watchdog
 * keep-alives for units with Type=notify and WatchdogSec=
 * (docs/operations.md, systemd). Outside systemd (no NOTIFY_SOCKET) every
 * call does nothing.
 *
 * Threads: any; each call is one sendmsg on a socket of its own. */
#ifndef ZB_SD_H
#define ZB_SD_H

#include <stdbool.h>
#include <stdint.h>

/* Sends state ("READY=1\nSTATUS=serving") to $NOTIFY_SOCKET; true when it
 * was sent, false when there is no socket or sending failed. */
bool zb_sd_notify(const char *state);
/* printf-style zb_sd_notify. */
bool zb_sd_notifyf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The watchdog period in microseconds that $WATCHDOG_USEC asks of this
 * process ($WATCHDOG_PID, when set, must be ours); 0: no watchdog. Send
 * "WATCHDOG=1" at least twice per period. */
uint64_t zb_sd_watchdog_usec(void);

#endif
