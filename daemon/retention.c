/* retention.c — finished jobs leave the coordinator, and their rows and
 * events the store, once they are older than retain_finished_s or more
 * than retain_finished_jobs newer finished jobs exist (docs/operations.md,
 * Retention), so memory, the store and every walk over the jobs stay
 * bounded however long the coordinator runs. Ids never repeat: the store
 * keeps the largest number ever used (zb_store_last_job_number). */
#include "coordinator.h"
#include "zb_log.h"

/* Pruning runs once a second at most, and deletes at most this many jobs
 * at a time so a large backlog (a lowered limit) never holds the loop. */
enum { PRUNE_EVERY_MS = 1000, PRUNE_BATCH = 64 };

/* A finished job nobody still points at: no watcher streaming it, no
 * worker holding it, no plan being made for it, its row durable. */
static bool prunable(const coord *co, const coord_job *j) {
  if (!job_terminal(j) || j->watchers || j->dirty || j->updating || j->start_planning)
    return false;
  for (const coord_worker *w = co->workers; w; w = w->next)
    if (w->job == j)
      return false;
  return true;
}

void coord_prune_jobs(coord *co, int64_t now_ms) {
  if (now_ms - co->last_prune_ms < PRUNE_EVERY_MS || co->store_failing)
    return;
  co->last_prune_ms = now_ms;
  long long finished = 0;
  for (const coord_job *j = co->jobs; j; j = j->next)
    finished += job_terminal(j);
  /* the oldest `over` finished jobs are past the count limit */
  long long over = finished - co->cfg.retain_finished_jobs;
  int64_t cutoff = now_ms - co->cfg.retain_finished_s * 1000;
  int pruned = 0;
  for (coord_job **pp = &co->jobs; *pp && pruned < PRUNE_BATCH;) {
    coord_job *j = *pp;
    bool expired = jc_expired(&j->row, &over, cutoff);
    if (!expired || !prunable(co, j)) {
      pp = &j->next;
      continue;
    }
    zb_diag d;
    if (zb_store_delete_job(co->store, j->row.id, &d) != ZB_OK) {
      ZB_WARN("retention: %s (kept; tried again later)", d.msg);
      break;
    }
    *pp = j->next;
    zb_strmap_remove(&co->job_index, j->row.id);
    coord_metrics_forget_job(j);
    job_free(j);
    pruned++;
  }
  co->jobs_pruned += pruned;
  if (pruned)
    ZB_INFO("retention: pruned %d finished job(s); %lld finished kept", pruned, finished - pruned);
}
