/* coordinator.h — zb-coordinator's state and the parts that share it:
 * the RPC table (coordinator.c), the metrics endpoint (metrics.c) and
 * main (main.c). Everything here is owned by the one libuv loop thread;
 * only the metrics text crosses to libmicrohttpd's thread, under a lock.
 */
#ifndef ZB_COORDINATOR_H
#define ZB_COORDINATOR_H

#include <pthread.h>
#include <stdint.h>
#include <uv.h>

#include "coord_config.h"
#include "zb/v1/zb.pb-c.h"
#include "zb_buf.h"
#include "zb_rpc.h"
#include "zb_store.h"
#include "zb_wire.h"

typedef struct coord coord;
typedef struct coord_job coord_job;

typedef struct coord_worker {
  coord *co;
  char id[64];
  char data_address[128];
  char hostname[64];
  char gpu[128];
  char backends[64], transports[64]; /* comma-separated */
  zb_rpc_call *attach;               /* the Attach stream; NULL when detached */
  int64_t last_seen_ms;
  coord_job *job; /* NULL: idle */
  int rank;
  struct coord_worker *next;
} coord_worker;

/* What the ranks reported for one iteration, until all p are in. */
typedef struct coord_iter_slot {
  int iteration; /* -1: free */
  int n;
  bool *have;
  Zb__V1__RankIteration *ranks;
  char schedule[32];
  double predicted;
  int loss_rank; /* the rank hosting the last stage of a cpu job's plan; -1: no loss */
} coord_iter_slot;

enum { COORD_ITER_SLOTS = 8 };

typedef struct coord_watcher {
  zb_rpc_call *call;
  coord_job *job;
  struct coord_watcher *next;
} coord_watcher;

struct coord_job {
  zb_store_job row; /* what the store keeps (row.spec / row.last owned here) */
  zb_job_spec spec;
  /* while RUNNING */
  zb_wire_plan plan, next_plan; /* next_plan: an update waiting for switch_at */
  int plan_version, switch_at;
  coord_worker **ranks; /* p workers, by rank */
  int done_ranks;
  bool *rank_done;
  coord_iter_slot slots[COORD_ITER_SLOTS];
  int max_reported; /* highest iteration any rank reported */
  double samples_per_second;
  coord_watcher *watchers;
  /* a rank's reported failure, held until fail_at_ms (0: none) in case a
   * lost worker of the job caused it */
  int64_t fail_at_ms;
  char fail_reason[256];
  struct coord_job *next;
};

struct coord {
  uv_loop_t *loop;
  zb_coord_config cfg;
  const char *config_path; /* for SIGHUP */
  /* given as flags, which win over the file at every reload too */
  bool heartbeat_flag, log_level_flag;
  zb_store *store;
  zb_rpc_server *rpc;
  int grpc_port, metrics_port;
  coord_job *jobs; /* oldest first */
  coord_worker *workers;
  int next_job_number;
  uv_timer_t tick;
  int64_t last_tick_ms; /* when coord_tick last ran (the tick timer's start before the first) */
  uv_signal_t sigterm, sigint, sighup;
  bool stopping;
  /* metrics: counters the loop keeps, the text libmicrohttpd serves */
  struct coord_metrics *metrics;
};

/* The period of coord_tick. */
enum { COORD_TICK_MS = 250 };
/* How long a rank's reported failure waits for the loss of a worker of the
 * same job, which is the better reason: a killed worker's neighbours see
 * its connections close about when the coordinator sees its stream close. */
enum { COORD_FAIL_GRACE_MS = 500 };

/* coordinator.c */
extern const zb_rpc_method coord_methods[];
extern const int coord_n_methods;
/* Loads jobs from the store (marking interrupted ones failed). */
zb_err coord_load(coord *co, zb_diag *diag);
/* Periodic work: heartbeat timeouts, pings, pending jobs, metrics text. */
void coord_tick(coord *co);
/* Frees jobs, workers and watchers (after the RPC server is gone). */
void coord_free_state(coord *co);
int64_t coord_now_ms(void);

/* metrics.c */
zb_err coord_metrics_start(coord *co, zb_diag *diag);
void coord_metrics_stop(coord *co);
/* Re-renders the Prometheus text from the state (loop thread). */
void coord_metrics_render(coord *co);
void coord_metrics_observe_plan(coord *co, double seconds);
void coord_metrics_observe_ops(coord *co, const coord_job *job, const Zb__V1__RankIteration *it);
void coord_metrics_count_report(coord *co);

#endif
