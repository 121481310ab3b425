/* bench_service.h — what the files of zb_bench_service share: the
 * processes it starts (a zb-coordinator and zb-workers on loopback, logs
 * in bench_dir) and how it reads the coordinator's own CPU time, so that
 * figures about the coordinator are its process's and not the machine's
 * (other load on the host does not count). */
#ifndef ZB_BENCH_SERVICE_H
#define ZB_BENCH_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "zb_rpc.h"

#ifndef ZB_BUILD_TYPE
#define ZB_BUILD_TYPE "unknown"
#endif

typedef struct cluster {
  pid_t coord;
  pid_t workers[64];
  int n_workers;
  char addr[64];
  zb_rpc_client *rpc;
} cluster;

extern char bench_dir[256];

void sleep_s(double s);
/* The coordinator (heartbeat timeout heartbeat_timeout_ms) and n_workers
 * zb-workers, all attached when it returns (exits on failure). */
void cluster_start_timeout(cluster *c, int n_workers, const char *tag, int heartbeat_timeout_ms);
void cluster_stop(cluster *c);
/* Workers the coordinator lists (ListWorkers), -1 when it does not answer. */
int attached_workers(cluster *c);
/* User plus system CPU seconds process pid has used so far, all its
 * threads (those gone too; /proc/PID/stat, clock-tick resolution); -1 when
 * it cannot be read. */
double proc_cpu_seconds(pid_t pid);

/* Context switches (voluntary and not) of process pid's live threads so
 * far (/proc/PID/task/TID/status); -1 when they cannot be read. */
long long proc_ctx_switches(pid_t pid);

/* The baseline of (b), bench_service_floor.c: starts this program as a
 * bare gRPC server of the Report method on loopback, its address into
 * addr; its pid, or -1 when it did not start. floor_server_main is that
 * process (`--floor-server PORT_FILE`; it runs until killed). */
pid_t floor_server_start(char *addr, size_t addr_len);
int floor_server_main(const char *port_file);

/* (f), bench_service_idle.c: the coordinator's CPU with 1,000 attached
 * idle workers. */
void bench_idle(bool quick);

#endif
