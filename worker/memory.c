/* memory.c — the host memory a worker advertises to the coordinator
 * (AttachRequest.memory_bytes), which refuses a cpu job whose model cannot
 * fit (docs/operations.md, Admission): what the kernel says is available
 * now, capped by the memory limit of the worker's cgroup (a container's or
 * a systemd unit's MemoryMax), since allocating past that gets the worker
 * killed, not refused. Read once at start; --memory-bytes overrides. */
#include <stdio.h>
#include <string.h>

#include "worker.h"

/* A kernel memory figure: "MemAvailable:  123 kB" from /proc/meminfo. */
static long long meminfo_bytes(const char *key) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f)
    return 0;
  char line[256];
  long long kb = 0;
  size_t n = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%lld", &kb) == 1)
      break;
  fclose(f);
  return kb * 1024;
}

/* The first number in a file ("max" and unreadable files: 0, no limit). */
static long long file_number(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  long long v = 0;
  if (fscanf(f, "%lld", &v) != 1)
    v = 0;
  fclose(f);
  return v;
}

long long worker_host_memory(void) {
  long long avail = meminfo_bytes("MemAvailable");
  /* cgroup v2 at the unified mount (a container sees its own there), then v1 */
  long long limit = file_number("/sys/fs/cgroup/memory.max");
  if (!limit)
    limit = file_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  if (limit > 0 && (avail == 0 || limit < avail))
    return limit;
  return avail;
}
