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

/* The first number in a file ("max" and unreadable files: 0, no limit;
 * cgroup v1's "unlimited", a number near 2^63, too). */
static long long file_number(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  long long v = 0;
  if (fscanf(f, "%lld", &v) != 1 || v < 0 || v > (1LL << 60))
    v = 0;
  fclose(f);
  return v;
}

/* Where the hierarchy that limits the worker's memory is mounted, from
 * /proc/self/mountinfo: cgroup v2 (fstype cgroup2), or v1 with the memory
 * controller among its super options. */
static bool cgroup_mount(bool v2, char *out, size_t cap) {
  FILE *f = fopen("/proc/self/mountinfo", "r");
  if (!f)
    return false;
  char line[1024], dir[512], fstype[64], opts[512];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    const char *dash = strstr(line, " - ");
    if (!dash || sscanf(line, "%*s %*s %*s %*s %511s", dir) != 1 ||
        sscanf(dash + 3, "%63s %*s %511s", fstype, opts) != 2)
      continue;
    bool memory = strcmp(fstype, "cgroup") == 0 && (strstr(opts, ",memory") || !strncmp(opts, "memory", 6));
    found = v2 ? strcmp(fstype, "cgroup2") == 0 : memory;
    if (found)
      snprintf(out, cap, "%s", dir);
  }
  fclose(f);
  return found;
}

/* The worker's own cgroup in that hierarchy, from /proc/self/cgroup: the
 * "0::PATH" line for v2, the line naming the memory controller for v1. */
static bool cgroup_path(bool v2, char *out, size_t cap) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f)
    return false;
  char line[1024];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2)
      continue;
    *c2 = '\0';
    const char *ctl = c1 + 1;
    found = v2 ? ctl[0] == '\0' && strncmp(line, "0:", 2) == 0
               : strcmp(ctl, "memory") == 0 || strstr(ctl, ",memory") || !strncmp(ctl, "memory,", 7);
    if (found) {
      c2[1 + strcspn(c2 + 1, "\n")] = '\0';
      snprintf(out, cap, "%s", c2 + 1);
    }
  }
  fclose(f);
  return found;
}

/* The tightest of file's limits from the worker's cgroup up to the
 * hierarchy's root (a parent's limit binds its children); 0: none. */
static long long cgroup_limit(bool v2, const char *file) {
  char mount[512], path[512], at[1200];
  if (!cgroup_mount(v2, mount, sizeof mount) || !cgroup_path(v2, path, sizeof path))
    return 0;
  long long limit = 0;
  for (;;) {
    snprintf(at, sizeof at, "%s%s/%s", mount, strcmp(path, "/") == 0 ? "" : path, file);
    long long v = file_number(at);
    if (v > 0 && (limit == 0 || v < limit))
      limit = v;
    char *slash = strrchr(path, '/');
    if (!slash || slash == path) {
      if (strcmp(path, "/") == 0)
        break;
      snprintf(path, sizeof path, "/");
      continue;
    }
    *slash = '\0';
  }
  return limit;
}

long long worker_memory_limit(void) {
  long long v2 = cgroup_limit(true, "memory.max"), v1 = cgroup_limit(false, "memory.limit_in_bytes");
  if (v2 > 0 && (v1 == 0 || v2 < v1))
    return v2;
  return v1;
}

long long worker_host_memory(void) {
  long long avail = meminfo_bytes("MemAvailable");
  /* the worker's own cgroup and its ancestors, v2 and v1 (a container's,
   * or a systemd unit's MemoryMax), not the root's */
  long long limit = worker_memory_limit();
  if (limit > 0 && (avail == 0 || limit < avail))
    return limit;
  return avail;
}
