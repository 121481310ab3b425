/* metrics_text.c — the Prometheus text of the coordinator's state
 * (docs/operations.md, Metrics), rendered on the loop when scraped. Per-job
 * series carry the label job_id (never `job`, Prometheus's own target
 * label); a finished job's leave the text metrics_keep_ended_s after it
 * ended, and its op histograms are dropped then. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_internal.h"
#include "zb_clock.h"
#include "zb_jobspec_dp.h"

#ifndef ZB_VERSION
#define ZB_VERSION "unknown"
#endif

static void family(zb_buf *b, const char *name, const char *type, const char *help) {
  zb_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A job whose series are in the text: active, or ended within the keep
 * (metrics_keep_ended_s). */
static bool job_visible(const coord *co, const coord_job *j, int64_t now_ms) {
  return !job_terminal(j) || now_ms - j->row.updated_ms < co->cfg.metrics_keep_ended_s * 1000;
}

/* Drops the op histograms of jobs that ended more than the keep ago. */
static void forget_ended(coord *co, int64_t now_ms) {
  for (coord_job *j = co->jobs; j; j = j->next)
    if (!j->metrics_forgotten && !job_visible(co, j, now_ms)) {
      coord_metrics_forget_job(j);
      j->metrics_forgotten = true;
    }
}

static void render_totals(coord *co, zb_buf *b) {
  const coord_metrics *mx = co->metrics;
  family(b, "zb_build_info", "gauge", "Build of this zb-coordinator; the value is always 1.");
  zb_buf_printf(b, "zb_build_info{version=\"%s\"} 1\n", ZB_VERSION);
  family(b, "zb_jobs", "gauge", "Jobs the coordinator holds, by state.");
  static const char *const states[] = {"pending", "running", "succeeded", "failed", "cancelled"};
  int counts[6] = {0};
  for (coord_job *j = co->jobs; j; j = j->next)
    if (j->row.state >= 1 && j->row.state <= 5)
      counts[j->row.state]++;
  for (int s = 1; s <= 5; s++)
    zb_buf_printf(b, "zb_jobs{state=\"%s\"} %d\n", states[s - 1], counts[s]);
  family(b, "zb_jobs_finished_total", "counter", "Jobs that ended since the coordinator started, by how.");
  for (int s = 0; s < 3; s++)
    zb_buf_printf(b, "zb_jobs_finished_total{state=\"%s\"} %lld\n", states[s + 2], mx->finished_total[s]);
  family(b, "zb_workers_attached", "gauge", "Workers with a live Attach stream.");
  zb_buf_printf(b, "zb_workers_attached %d\n", workers_attached(co));
  family(b, "zb_workers_lost_total", "counter",
         "Workers lost since start: silent past the heartbeat timeout or their Attach stream closed.");
  zb_buf_printf(b, "zb_workers_lost_total %lld\n", mx->workers_lost_total);
  family(b, "zb_reports_total", "counter", "Report calls received from workers.");
  zb_buf_printf(b, "zb_reports_total %lld\n", mx->reports_total);
  family(b, "zb_jobs_pruned_total", "counter",
         "Finished jobs removed with their events by retention (retain_finished_jobs, retain_finished_s).");
  zb_buf_printf(b, "zb_jobs_pruned_total %lld\n", co->jobs_pruned);
  family(b, "zb_watch_streams", "gauge", "WatchJob streams open (a cut one until its last message left).");
  zb_buf_printf(b, "zb_watch_streams %lld\n", co->watch_acct.calls);
  family(b, "zb_watch_queued_bytes", "gauge",
         "Bytes of events queued or in flight for WatchJob streams (max_watch_bytes_total bounds them).");
  zb_buf_printf(b, "zb_watch_queued_bytes %lld\n", co->watch_acct.bytes);
  family(b, "zb_watch_streams_cut_total", "counter",
         "WatchJob streams cut for falling behind: past their own budget, or the total's.");
  zb_buf_printf(b, "zb_watch_streams_cut_total{budget=\"stream\"} %lld\n", co->watch_cut_behind);
  zb_buf_printf(b, "zb_watch_streams_cut_total{budget=\"total\"} %lld\n", co->watch_cut_total);
}

/* The lines of the per-job and per-rank families, gathered in one pass
 * over the jobs (a running job's last iteration is unpacked once). */
typedef struct job_lines {
  zb_buf running, iterations, mbps, sps, tps, iter_s, loss, bubble, predicted;
  zb_buf rank_bubble, rank_mem, rank_comm, rank_dev_peak, rank_dev_used;
} job_lines;

/* A per-rank series' labels: the global rank and its replica
 * (docs/formats.md, Data parallelism). */
static void rank_label(char *out, size_t cap, int g, int p) {
  snprintf(out, cap, "rank=\"%d\",replica=\"%d\"", g, p > 0 ? zb_dp_replica(g, p) : 0);
}

static void rank_lines(const char *id, int p, const Zb__V1__IterationMetrics *it, job_lines *l) {
  for (size_t r = 0; r < it->n_ranks; r++) {
    const Zb__V1__RankIteration *ri = it->ranks[r];
    char lab[64];
    rank_label(lab, sizeof lab, ri->rank, p);
    zb_buf_printf(&l->rank_bubble, "zb_rank_bubble_ratio{job_id=\"%s\",%s} %.6g\n", id, lab,
                  ri->bubble_ratio);
    zb_buf_printf(&l->rank_mem, "zb_rank_peak_memory_bytes{job_id=\"%s\",%s} %lld\n", id, lab,
                  (long long)ri->peak_memory_bytes);
    zb_buf_printf(&l->rank_comm, "zb_rank_comm_wait_seconds{job_id=\"%s\",%s} %.6g\n", id, lab,
                  ri->comm_wait_seconds);
    if (ri->device_peak_bytes <= 0) /* no GPU on this rank */
      continue;
    zb_buf_printf(&l->rank_dev_peak, "zb_rank_device_peak_bytes{job_id=\"%s\",%s} %lld\n", id, lab,
                  (long long)ri->device_peak_bytes);
    zb_buf_printf(&l->rank_dev_used, "zb_rank_device_used_bytes{job_id=\"%s\",%s} %lld\n", id, lab,
                  (long long)ri->device_used_bytes);
  }
}

static void job_last_iteration(coord_job *j, job_lines *l) {
  const char *id = j->row.id;
  Zb__V1__IterationMetrics *it =
      j->row.last ? (Zb__V1__IterationMetrics *)protobuf_c_message_unpack(
                        &zb__v1__iteration_metrics__descriptor, NULL, j->row.last_len, j->row.last)
                  : NULL;
  if (!it)
    return;
  /* global: every replica ran its own microbatches */
  double mbps =
      it->wall_seconds > 0 ? (double)j->spec.data_parallel * j->spec.microbatches / it->wall_seconds : 0;
  zb_buf_printf(&l->mbps, "zb_job_microbatches_per_second{job_id=\"%s\"} %.6g\n", id, mbps);
  if (zb_job_spec_trains_model(&j->spec)) { /* a sim job has microbatches, not samples */
    double sps = mbps * j->spec.model.batch;
    zb_buf_printf(&l->sps, "zb_job_samples_per_second{job_id=\"%s\"} %.6g\n", id, sps);
    zb_buf_printf(&l->tps, "zb_job_tokens_per_second{job_id=\"%s\"} %.6g\n", id, sps * j->spec.model.seq_len);
  }
  zb_buf_printf(&l->iter_s, "zb_job_iteration_seconds{job_id=\"%s\"} %.6g\n", id, it->wall_seconds);
  if (it->has_loss)
    zb_buf_printf(&l->loss, "zb_job_loss{job_id=\"%s\"} %.9g\n", id, it->loss);
  zb_buf_printf(&l->bubble, "zb_job_bubble_ratio{job_id=\"%s\"} %.6g\n", id, it->bubble_ratio);
  zb_buf_printf(&l->predicted, "zb_job_predicted_bubble_ratio{job_id=\"%s\"} %.6g\n", id,
                it->predicted_bubble_ratio);
  rank_lines(id, j->spec.ranks, it, l);
  protobuf_c_message_free_unpacked(&it->base, NULL);
}

static void emit(zb_buf *b, const char *name, const char *type, const char *help, zb_buf *lines) {
  family(b, name, type, help);
  if (lines->len)
    zb_buf_append(b, lines->data, lines->len);
  zb_buf_free(lines);
}

static void render_jobs(coord *co, zb_buf *b, int64_t now_ms) {
  job_lines l;
  memset(&l, 0, sizeof l);
  for (coord_job *j = co->jobs; j; j = j->next) {
    if (!job_visible(co, j, now_ms))
      continue;
    bool running = j->row.state == ZB_JOB_RUNNING;
    zb_buf_printf(&l.running, "zb_job_running{job_id=\"%s\"} %d\n", j->row.id, running);
    zb_buf_printf(&l.iterations, "zb_job_iterations_total{job_id=\"%s\"} %d\n", j->row.id,
                  j->row.iterations_done);
    if (running)
      job_last_iteration(j, &l);
  }
  emit(b, "zb_job_running", "gauge", "1 while a job runs, 0 once it ended (until its series leave), by job.",
       &l.running);
  emit(b, "zb_job_iterations_total", "counter", "Iterations a job has completed on all ranks.",
       &l.iterations);
  emit(b, "zb_job_microbatches_per_second", "gauge",
       "Microbatches per second over a running job's last iteration, all replicas together.", &l.mbps);
  emit(b, "zb_job_samples_per_second", "gauge",
       "Sequences per second (microbatches x model.batch) over a training job's last iteration.", &l.sps);
  emit(b, "zb_job_tokens_per_second", "gauge",
       "Tokens per second (samples x model.seq_len) over a training job's last iteration.", &l.tps);
  emit(b, "zb_job_iteration_seconds", "gauge", "Wall time of a running job's last iteration (slowest rank).",
       &l.iter_s);
  emit(b, "zb_job_loss", "gauge", "Mean training loss of a running job's last iteration.", &l.loss);
  emit(b, "zb_job_bubble_ratio", "gauge", "Measured idle share of a running job's last iteration, all ranks.",
       &l.bubble);
  emit(b, "zb_job_predicted_bubble_ratio", "gauge",
       "The simulator's bubble ratio for a running job's plan, same definition.", &l.predicted);
  emit(b, "zb_rank_bubble_ratio", "gauge", "Measured idle share of a rank's last iteration.", &l.rank_bubble);
  emit(b, "zb_rank_peak_memory_bytes", "gauge", "Peak activation memory of a rank in its last iteration.",
       &l.rank_mem);
  emit(b, "zb_rank_comm_wait_seconds", "gauge",
       "Seconds a rank waited in transport groups (sends and receives) in its last iteration.", &l.rank_comm);
  emit(b, "zb_rank_device_peak_bytes", "gauge",
       "A GPU rank's device memory high-water mark since its job started: the allocator's blocks at their "
       "rounded size, cached ones and the cuBLAS workspace included.",
       &l.rank_dev_peak);
  emit(b, "zb_rank_device_used_bytes", "gauge",
       "A GPU rank's device used bytes (cudaMemGetInfo total - free, every process) when its peak was last "
       "raised.",
       &l.rank_dev_used);
}

/* Per-rank slowdown of running jobs, from their last sampled iteration
 * (learn.c): the ratio, and 1 for a straggler. */
static void render_slowdowns(coord *co, zb_buf *b) {
  zb_buf ratio = ZB_BUF_INIT, flag = ZB_BUF_INIT;
  for (coord_job *j = co->jobs; j; j = j->next) {
    if (j->row.state != ZB_JOB_RUNNING || !j->slowdown)
      continue;
    for (int r = 0; r < j->spec.ranks; r++) { /* learned from replica 0's timelines (learn.c) */
      char lab[64];
      rank_label(lab, sizeof lab, r, j->spec.ranks);
      zb_buf_printf(&ratio, "zb_rank_slowdown_ratio{job_id=\"%s\",%s} %.6g\n", j->row.id, lab,
                    j->slowdown[r]);
      zb_buf_printf(&flag, "zb_rank_straggler{job_id=\"%s\",%s} %d\n", j->row.id, lab,
                    j->slowdown[r] > COORD_STRAGGLER_RATIO);
    }
  }
  emit(b, "zb_rank_slowdown_ratio", "gauge",
       "A rank's compute time over the plan's, against the median rank's, in its job's last sampled "
       "iteration.",
       &ratio);
  emit(b, "zb_rank_straggler", "gauge", "1 when a rank's slowdown ratio exceeds 1.2 (a straggler), else 0.",
       &flag);
}

/* One series of zb_op_duration_seconds: its buckets, sum and count. */
static void render_op_hist(zb_buf *b, const char *job, const char *lab, const char *op, const op_hist *h) {
  for (int q = 0; q < METRICS_N_OP_BUCKETS; q++)
    zb_buf_printf(b, "zb_op_duration_seconds_bucket{job_id=\"%s\",%s,op=\"%s\",le=\"%g\"} %lld\n", job, lab,
                  op, metrics_op_buckets[q], h->counts[q]);
  zb_buf_printf(b, "zb_op_duration_seconds_bucket{job_id=\"%s\",%s,op=\"%s\",le=\"+Inf\"} %lld\n", job, lab,
                op, h->count);
  zb_buf_printf(b, "zb_op_duration_seconds_sum{job_id=\"%s\",%s,op=\"%s\"} %.9g\n", job, lab, op, h->sum);
  zb_buf_printf(b, "zb_op_duration_seconds_count{job_id=\"%s\",%s,op=\"%s\"} %lld\n", job, lab, op, h->count);
}

/* Every job's op histograms (those with an op observed), then planning's. */
static void render_histograms(coord *co, zb_buf *b) {
  const coord_metrics *mx = co->metrics;
  family(b, "zb_op_duration_seconds", "histogram",
         "Duration of each compute op (F, B, W, BW) of sampled iterations, by job and rank.");
  static const char *const ops[METRICS_N_OPS] = {"F", "B", "W", "BW"};
  for (const coord_job *j = co->jobs; j; j = j->next)
    for (int k = 0; j->op_hists && k < zb_job_spec_world(&j->spec) * METRICS_N_OPS; k++)
      if (j->op_hists[k].count > 0) {
        char lab[64];
        rank_label(lab, sizeof lab, k / METRICS_N_OPS, j->spec.ranks);
        render_op_hist(b, j->row.id, lab, ops[k % METRICS_N_OPS], &j->op_hists[k]);
      }
  family(b, "zb_plan_seconds", "histogram", "Time libzb took to generate a schedule.");
  for (int q = 0; q < METRICS_N_PLAN_BUCKETS; q++)
    zb_buf_printf(b, "zb_plan_seconds_bucket{le=\"%g\"} %lld\n", metrics_plan_buckets[q], mx->plan_counts[q]);
  zb_buf_printf(b, "zb_plan_seconds_bucket{le=\"+Inf\"} %lld\n", mx->plan_count);
  zb_buf_printf(b, "zb_plan_seconds_sum %.9g\n", mx->plan_sum);
  zb_buf_printf(b, "zb_plan_seconds_count %lld\n", mx->plan_count);
}

void metrics_render_text(coord *co, zb_buf *out) {
  int64_t now = zb_clock_unix_ms();
  forget_ended(co, now);
  render_totals(co, out);
  render_jobs(co, out, now);
  render_slowdowns(co, out);
  render_histograms(co, out);
  coord_metrics_process(out);
}
