/* zb_format_csv_comm.c — a lowered schedule as PyTorch's "compute_comms"
 * CSV (zb_csv_write_comms, zb_format.h): the lists as they are, plus the
 * actions PyTorch's _PipelineScheduleRuntime needs to run them with its
 * default arguments (docs/formats.md, csv-comm).
 *
 * Gradient reduction. The runtime scales a stage's gradients by 1/m (its
 * default scale_grads) only when it runs that stage's REDUCE_GRAD, and
 * starts FSDP's reduce-scatter there; it refuses a second REDUCE_GRAD
 * while one is pending, so each is followed by its WAIT_REDUCE_GRAD, as
 * its own lowering does by default. A stage's pair goes after its last W
 * (or BW) on the rank, past the sends that follow that action (they need
 * not wait for the reduction), or where the lists already hold the
 * stage's REDUCE_GRAD (zb_reduce.h).
 *
 * Send waits. A WAIT_SEND_* blocks until the peer has taken the data, so
 * each goes right after the first later action of its rank that cannot
 * run before the peer took it: for SEND_F(s, k), a forward of microbatch
 * k at a stage above s or any backward of k (every backward of k follows
 * the last stage's forward of k); for SEND_B(s, k), a backward of k at a
 * stage below s. Such a wait never stalls, and it retires the send (and
 * PyTorch's reference to the sent activation) as early as that allows.
 * A send without such an action is waited on at the end of the list, as
 * late as PyTorch allows, after the reductions (PyTorch's own lowering
 * puts its backward sends' waits there; its forward waits follow the
 * matching backward, which this rule finds or precedes). */
#include <stdint.h>
#include <stdlib.h>

#include "zb_alloc.h"
#include "zb_format_internal.h"

/* Whether a, at a later point of the sender's list, runs only after the
 * peer has received send. */
static bool proves_received(const zb_action *send, const zb_action *a) {
  if (a->mb != send->mb)
    return false;
  bool backward = a->op == ZB_OP_B || a->op == ZB_OP_BW || a->op == ZB_OP_W;
  if (send->op == ZB_OP_SEND_F)
    return backward || (a->op == ZB_OP_F && a->stage > send->stage);
  return backward && a->stage < send->stage;
}

/* Index of the action at which something anchored at i may follow: past
 * the second action of an overlapped pair, which is written as one cell. */
static int after_pair(const zb_rank_list *l, int i) {
  return l->actions[i].overlap && i + 1 < l->n && zb_op_is_compute(l->actions[i + 1].op) ? i + 1 : i;
}

/* What is written besides the list's own actions: a wait or a reduction
 * pair, placed after the list's action `at` (l->n: at the end). */
typedef struct extra {
  int at;
  int64_t order; /* at one point: waits, reductions, then (at the end) waits */
  zb_action a;
} extra;

/* The order of an extra at its point: its class, then its own rank. */
#define EXTRA_ORDER(cls, k) ((int64_t)(cls) << 32 | (int64_t)(k))

static int extra_cmp(const void *x, const void *y) {
  const extra *a = x, *b = y;
  if (a->at != b->at)
    return a->at < b->at ? -1 : 1;
  return a->order < b->order ? -1 : a->order > b->order;
}

/* by_mb: the list's compute actions grouped by microbatch (indices in
 * list order), start[k]..start[k+1] for microbatch k. */
typedef struct mb_index {
  int *start, *idx;
} mb_index;

static mb_index mb_index_build(const zb_rank_list *l, int m) {
  mb_index x = {zb_calloc((size_t)m + 2, sizeof(int)), zb_malloc(sizeof(int) * ((size_t)l->n + 1))};
  for (int i = 0; i < l->n; i++)
    if (zb_op_is_compute(l->actions[i].op) && l->actions[i].mb >= 0 && l->actions[i].mb < m)
      x.start[l->actions[i].mb + 2]++;
  for (int k = 0; k < m; k++)
    x.start[k + 2] += x.start[k + 1];
  for (int i = 0; i < l->n; i++)
    if (zb_op_is_compute(l->actions[i].op) && l->actions[i].mb >= 0 && l->actions[i].mb < m)
      x.idx[x.start[l->actions[i].mb + 1]++] = i;
  return x;
}

/* The wait of the send at index i (see the top of the file). */
static extra send_wait(const zb_rank_list *l, const mb_index *x, int m, int i) {
  const zb_action *send = &l->actions[i];
  zb_action w = *send;
  w.op = send->op == ZB_OP_SEND_F ? ZB_OP_WAIT_SEND_F : ZB_OP_WAIT_SEND_B;
  w.batch = false;
  extra e = {.at = l->n, .order = EXTRA_ORDER(2, i), .a = w};
  if (send->mb < 0 || send->mb >= m)
    return e;
  for (int k = x->start[send->mb]; k < x->start[send->mb + 1]; k++) {
    int j = x->idx[k];
    if (j > i && proves_received(send, &l->actions[j])) {
      e.at = after_pair(l, j);
      e.order = EXTRA_ORDER(0, i);
      break;
    }
  }
  return e;
}

/* Where stage's REDUCE_GRAD goes in l: at the list's own REDUCE_GRAD of
 * the stage, else after its last W or BW and the sends right after it,
 * else (a list without them) at the end. */
static int reduce_at(const zb_rank_list *l, int stage) {
  int last = -1;
  for (int i = 0; i < l->n; i++) {
    const zb_action *a = &l->actions[i];
    if (a->stage == stage && a->op == ZB_OP_REDUCE_GRAD)
      return i;
    if (a->stage == stage && (a->op == ZB_OP_W || a->op == ZB_OP_BW))
      last = i;
  }
  if (last < 0)
    return l->n;
  last = after_pair(l, last);
  while (last + 1 < l->n &&
         (l->actions[last + 1].op == ZB_OP_SEND_F || l->actions[last + 1].op == ZB_OP_SEND_B))
    last++;
  return last;
}

/* Whether the writer drops a as the list gives it: it writes its own
 * waits and reduction pairs, and PyTorch reads an empty cell as no
 * action, which compute_comms refuses. */
static bool rewritten(zb_op op) {
  return op == ZB_OP_NONE || op == ZB_OP_WAIT_SEND_F || op == ZB_OP_WAIT_SEND_B || op == ZB_OP_REDUCE_GRAD ||
         op == ZB_OP_WAIT_REDUCE_GRAD;
}

/* The extras of rank r's list, sorted by where they go; *n_out of them. */
static extra *rank_extras(const zb_schedule *s, int r, int *n_out) {
  const zb_rank_list *l = &s->ranks[r];
  int S = zb_schedule_stages(s), n = 0;
  extra *ex = zb_malloc(sizeof *ex * ((size_t)l->n + 2 * (size_t)s->v + 1));
  mb_index x = mb_index_build(l, s->m);
  for (int i = 0; i < l->n; i++)
    if (l->actions[i].op == ZB_OP_SEND_F || l->actions[i].op == ZB_OP_SEND_B)
      ex[n++] = send_wait(l, &x, s->m, i);
  free(x.start);
  free(x.idx);
  for (int st = 0; st < S; st++) {
    if (zb_stage_rank(s, st) != r)
      continue;
    int at = reduce_at(l, st);
    zb_action red = {.op = ZB_OP_REDUCE_GRAD, .stage = st, .mb = -1, .peer = -1};
    ex[n++] = (extra){.at = at, .order = EXTRA_ORDER(1, 2 * st), .a = red};
    red.op = ZB_OP_WAIT_REDUCE_GRAD;
    ex[n++] = (extra){.at = at, .order = EXTRA_ORDER(1, 2 * st + 1), .a = red};
  }
  qsort(ex, (size_t)n, sizeof *ex, extra_cmp);
  *n_out = n;
  return ex;
}

void zb_csv_write_comms(const zb_schedule *s, zb_buf *out) {
  for (int r = 0; r < s->p; r++) {
    const zb_rank_list *l = &s->ranks[r];
    int n_ex = 0, e = 0;
    extra *ex = rank_extras(s, r, &n_ex);
    zb_rank_list row = {.actions = zb_malloc(sizeof(zb_action) * ((size_t)l->n + (size_t)n_ex + 1))};
    for (int i = 0; i <= l->n; i++) {
      if (i < l->n && !rewritten(l->actions[i].op))
        row.actions[row.n++] = l->actions[i];
      for (; e < n_ex && ex[e].at == i; e++)
        row.actions[row.n++] = ex[e].a;
    }
    row.cap = row.n;
    zb_csv_write_row(&row, out);
    free(row.actions);
    free(ex);
  }
}
