/* job_core.c — the job lifecycle's rules (job_core.h). */
#include "job_core.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_wire.h"

bool jc_room_in_queue(long long waiting, long long cap) {
  return waiting < cap;
}

void jc_row_new(const zb_job_spec *spec, int64_t *next_number, int64_t now_ms, zb_store_job *row) {
  memset(row, 0, sizeof *row);
  snprintf(row->id, sizeof row->id, "j-%" PRId64, (*next_number)++);
  snprintf(row->name, sizeof row->name, "%s", spec->name);
  snprintf(row->schedule, sizeof row->schedule, "%s", spec->schedule);
  row->state = ZB_JOB_PENDING;
  snprintf(row->reason, sizeof row->reason, "submitted");
  row->created_ms = now_ms;
  row->next_seq = 1;
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(spec, &pb);
  row->spec_len = protobuf_c_message_get_packed_size(&pb.base);
  row->spec = zb_malloc(row->spec_len ? row->spec_len : 1);
  protobuf_c_message_pack(&pb.base, row->spec);
  zb_wire_spec_pb_clear(&pb);
}

void jc_row_clear(zb_store_job *row) {
  free(row->spec);
  free(row->last);
  row->spec = row->last = NULL;
  row->spec_len = row->last_len = 0;
}

bool jc_may_move(int from, int to) {
  if (zb_job_state_final(from))
    return false;
  if (to == ZB_JOB_RUNNING)
    return from == ZB_JOB_PENDING || from == ZB_JOB_RUNNING;
  if (to == ZB_JOB_PENDING)
    return from == ZB_JOB_PENDING;
  return zb_job_state_final(to) && (from == ZB_JOB_PENDING || from == ZB_JOB_RUNNING);
}

zb_err jc_record(zb_store *st, zb_store_job *row, const jc_iteration *it, int64_t now_ms, zb_store_event *ev,
                 zb_diag *diag) {
  *ev = (zb_store_event){.seq = row->next_seq++, .unix_ms = now_ms, .state = row->state};
  snprintf(ev->job_id, sizeof ev->job_id, "%s", row->id);
  snprintf(ev->reason, sizeof ev->reason, "%s", row->reason);
  if (it) {
    ev->iteration = (uint8_t *)it->packed;
    ev->iteration_len = it->len;
    ev->indexed = true;
    ev->iteration_no = it->number;
    ev->traced = it->traced;
  }
  row->updated_ms = now_ms;
  zb_diag d;
  zb_err first = zb_store_append_event(st, ev, &d);
  if (first && diag)
    *diag = d;
  zb_err put = zb_store_put_job(st, row, first ? &d : diag);
  return first ? first : put;
}

zb_err jc_move(zb_store *st, zb_store_job *row, int to, const char *reason, int64_t now_ms,
               zb_store_event *ev, zb_diag *diag) {
  if (!jc_may_move(row->state, to))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "job %s: no move from %s to %s", row->id,
                       zb_job_state_name(row->state), zb_job_state_name(to));
  row->state = to;
  snprintf(row->reason, sizeof row->reason, "%s", reason);
  return jc_record(st, row, NULL, now_ms, ev, diag);
}

jc_step jc_queue_step(const jc_waiting *w, int64_t now_ms) {
  if (w->planning)
    return JC_HOLD;
  if (w->idle >= w->ranks)
    return w->has_plan ? JC_START : JC_PLAN;
  if (w->able >= w->ranks)
    return JC_HOLD;
  if (w->wait_for_workers_s > 0 && now_ms - w->created_ms > (int64_t)w->wait_for_workers_s * 1000)
    return JC_TIMED_OUT;
  return JC_WAIT_WORKERS;
}

jc_restart jc_at_restart(int state, bool spec_ok) {
  bool live = state == ZB_JOB_PENDING || state == ZB_JOB_RUNNING;
  if (!live)
    return JC_KEEP;
  if (!spec_ok)
    return JC_FAIL_UNREADABLE;
  return state == ZB_JOB_PENDING ? JC_READMIT : JC_RECOVER;
}

bool jc_expired(const zb_store_job *row, long long *over, int64_t cutoff_ms) {
  if (!zb_job_state_final(row->state))
    return false;
  bool past_count = (*over)-- > 0;
  return past_count || row->updated_ms < cutoff_ms;
}
