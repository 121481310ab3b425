/* The coordinator as a process: its open-files budget and the standard
 * process_* metrics Prometheus client libraries export (docs/operations.md,
 * Metrics). Linux only: the figures come from /proc/self. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include "coordinator.h"
#include "zb_log.h"

/* Below this many descriptors a few hundred idle connections can starve
 * accept(); worth a warning when the hard limit keeps us under it. */
enum { FD_BUDGET_WANTED = 8192 };

void coord_raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    ZB_WARN("cannot read the open-files limit: %s", strerror(errno));
    return;
  }
  rlim_t was = rl.rlim_cur;
  /* systemd and most shells start services at a soft limit of 1024 with a
   * far higher hard limit; every connection costs a descriptor, so take
   * what we are allowed */
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      ZB_WARN("cannot raise the open-files limit from %llu to %llu: %s", (unsigned long long)was,
              (unsigned long long)rl.rlim_max, strerror(errno));
      return;
    }
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < FD_BUDGET_WANTED)
    ZB_WARN("open-files limit is %llu (hard limit); a few hundred idle connections can exhaust it: raise "
            "LimitNOFILE / ulimit -Hn",
            (unsigned long long)rl.rlim_cur);
  else
    ZB_INFO("open-files limit %llu (was %llu)", (unsigned long long)rl.rlim_cur, (unsigned long long)was);
}

static long count_open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return -1;
  long n = 0;
  for (struct dirent *e; (e = readdir(d));)
    n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

/* utime and stime (fields 14 and 15, clock ticks), start time (22, ticks
 * after boot), vsize (23, bytes) and rss (24, pages) of /proc/self/stat */
typedef struct proc_stat {
  unsigned long long utime, stime, start, vsize;
  long long rss;
} proc_stat;

static bool read_proc_stat(proc_stat *ps) {
  FILE *f = fopen("/proc/self/stat", "r");
  if (!f)
    return false;
  char line[1024];
  bool ok = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  /* the command name (field 2) may hold spaces; fields resume after its ')' */
  char *p = ok ? strrchr(line, ')') : NULL;
  return p && sscanf(p + 2,
                     "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d "
                     "%llu %llu %lld",
                     &ps->utime, &ps->stime, &ps->start, &ps->vsize, &ps->rss) == 5;
}

static double boot_time_seconds(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f)
    return 0;
  char line[256];
  double btime = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "btime %lf", &btime) == 1)
      break;
  fclose(f);
  return btime;
}

static void gauge(zb_buf *b, const char *name, const char *type, const char *help, double v) {
  zb_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

void coord_metrics_process(zb_buf *b) {
  struct rlimit rl;
  long fds = count_open_fds();
  if (fds >= 0)
    gauge(b, "process_open_fds", "gauge", "Open file descriptors.", (double)fds);
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    gauge(b, "process_max_fds", "gauge", "Maximum number of open file descriptors.", (double)rl.rlim_cur);
  proc_stat ps;
  long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
  if (!read_proc_stat(&ps) || tick <= 0 || page <= 0)
    return;
  gauge(b, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
        (double)(ps.utime + ps.stime) / (double)tick);
  gauge(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
        (double)ps.rss * (double)page);
  gauge(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", (double)ps.vsize);
  double btime = boot_time_seconds();
  if (btime > 0)
    gauge(b, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
          btime + (double)ps.start / (double)tick);
}
