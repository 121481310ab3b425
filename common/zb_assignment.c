/* zb_assignment.c — encoding an Assignment; decoding is in
 * zb_assignment_decode.c. See zb_assignment.h. */
#include "zb_assignment.h"

#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_jobspec_dp.h"
#include "zb_wire.h"

Zb__V1__ActionKind zb_action_kind_of(zb_op op) {
  switch (op) {
  case ZB_OP_F: return ZB__V1__ACTION_KIND__ACTION_KIND_F;
  case ZB_OP_B: return ZB__V1__ACTION_KIND__ACTION_KIND_B;
  case ZB_OP_W: return ZB__V1__ACTION_KIND__ACTION_KIND_W;
  case ZB_OP_BW: return ZB__V1__ACTION_KIND__ACTION_KIND_BW;
  case ZB_OP_SEND_F: return ZB__V1__ACTION_KIND__ACTION_KIND_SEND_F;
  case ZB_OP_RECV_F: return ZB__V1__ACTION_KIND__ACTION_KIND_RECV_F;
  case ZB_OP_SEND_B: return ZB__V1__ACTION_KIND__ACTION_KIND_SEND_B;
  case ZB_OP_RECV_B: return ZB__V1__ACTION_KIND__ACTION_KIND_RECV_B;
  case ZB_OP_REDUCE_GRAD: return ZB__V1__ACTION_KIND__ACTION_KIND_REDUCE_GRAD;
  case ZB_OP_WAIT_REDUCE_GRAD: return ZB__V1__ACTION_KIND__ACTION_KIND_WAIT_REDUCE_GRAD;
  default: return ZB__V1__ACTION_KIND__ACTION_KIND_UNSPECIFIED;
  }
}

Zb__V1__ActionList *zb_action_list_encode(const zb_rank_list *l) {
  Zb__V1__ActionList *al = zb_malloc(sizeof *al);
  zb__v1__action_list__init(al);
  size_t n = (size_t)l->n, room = n ? n : 1;
  al->n_kind = al->n_stage = al->n_microbatch = al->n_peer = al->n_group_with_next = n;
  al->kind = zb_malloc(sizeof *al->kind * room);
  al->stage = zb_malloc(sizeof *al->stage * room);
  al->microbatch = zb_malloc(sizeof *al->microbatch * room);
  al->peer = zb_malloc(sizeof *al->peer * room);
  al->group_with_next = zb_malloc(sizeof *al->group_with_next * room);
  for (size_t i = 0; i < n; i++) {
    const zb_action *a = &l->actions[i];
    al->kind[i] = zb_action_kind_of(a->op);
    al->stage[i] = a->stage;
    al->microbatch[i] = a->mb;
    al->peer[i] = zb_op_is_comm(a->op) ? a->peer : -1;
    al->group_with_next[i] = zb_op_is_comm(a->op) && a->batch;
  }
  return al;
}

void zb_action_list_free(Zb__V1__ActionList *al) {
  if (!al)
    return;
  free(al->kind);
  free(al->stage);
  free(al->microbatch);
  free(al->peer);
  free(al->group_with_next);
  free(al);
}

static int cmp_int(const void *x, const void *y) {
  int a = *(const int *)x, b = *(const int *)y;
  return (a > b) - (a < b);
}

/* The ranks rank exchanges tensors with, rank +-1, and (tied) the other
 * end of a tied head; all: every other rank. Ascending and distinct, into
 * an allocated array; returns how many. */
static int peer_ranks(const zb_assignment_src *src, int rank, int **out) {
  const zb_planner_result *pl = src->plan;
  const zb_rank_list *l = &pl->lowered->ranks[rank];
  int p = pl->p;
  bool all = src->all_peers;
  int *q = zb_malloc(sizeof(int) * (size_t)(l->n + 4 + (all ? p : 0)));
  int n = 0;
  if (src->tied_ends) {
    int first = zb_placement_rank(pl->placement, p, pl->v, 0);
    int last = zb_placement_rank(pl->placement, p, pl->v, p * pl->v - 1);
    if (rank == first && last != rank)
      q[n++] = last;
    if (rank == last && first != rank)
      q[n++] = first;
  }
  for (int r = 0; all && r < p; r++)
    if (r != rank)
      q[n++] = r;
  for (int i = 0; i < l->n; i++)
    if (zb_op_is_comm(l->actions[i].op) && l->actions[i].peer >= 0)
      q[n++] = l->actions[i].peer;
  if (rank > 0)
    q[n++] = rank - 1;
  if (rank + 1 < p)
    q[n++] = rank + 1;
  qsort(q, (size_t)n, sizeof *q, cmp_int);
  int k = 0;
  for (int i = 0; i < n; i++)
    if (k == 0 || q[k - 1] != q[i])
      q[k++] = q[i];
  *out = q;
  return k;
}

/* Peers are named by global rank: the plan's peer q of this rank's
 * replica is replica x p + q (zb_jobspec_dp.h); a model job's ring
 * neighbours in other replicas follow. */
static void encode_peers(const zb_assignment_src *src, int rank, int replica, Zb__V1__Assignment *a) {
  int *q = NULL;
  int n = peer_ranks(src, rank, &q);
  int p = src->plan->p, base = replica * p, d = src->spec->data_parallel;
  /* replicas all-reduce each stage's gradients over a ring of the stage
   * group {k x p + rank} (docs/model.md, Data parallelism; a sim job's
   * replicas meet there too): its two ring neighbours, kept as p + global
   * rank */
  if (d > 1) {
    q = zb_realloc(q, sizeof(int) * (size_t)(n + 2));
    int next = (replica + 1) % d * p + rank, prev = (replica + d - 1) % d * p + rank;
    q[n++] = p + next;
    if (prev != next)
      q[n++] = p + prev;
  }
  if (n == 0) { /* a one-rank job talks to no one */
    free(q);
    return;
  }
  Zb__V1__PeerAddress *pa = zb_malloc(sizeof *pa * (size_t)n);
  a->peers = zb_malloc(sizeof *a->peers * (size_t)n);
  a->n_peers = (size_t)n;
  for (int k = 0; k < n; k++) {
    zb__v1__peer_address__init(&pa[k]);
    pa[k].rank = q[k] < p ? base + q[k] : q[k] - p;
    const char *addr = src->addresses ? src->addresses[pa[k].rank] : NULL;
    pa[k].address = (char *)(addr ? addr : "");
    a->peers[k] = &pa[k];
  }
  free(q);
}

static void encode_stages(const zb_assignment_src *src, int rank, Zb__V1__Assignment *a) {
  const zb_planner_result *pl = src->plan;
  const zb_costs *c = pl->costs;
  Zb__V1__HostedStage *hs = zb_malloc(sizeof *hs * (size_t)pl->v);
  a->stages = zb_malloc(sizeof *a->stages * (size_t)pl->v);
  size_t n = 0;
  for (int s = 0; s < c->n_stages && n < (size_t)pl->v; s++) {
    if (zb_placement_rank(pl->placement, pl->p, pl->v, s) != rank)
      continue;
    zb__v1__hosted_stage__init(&hs[n]);
    hs[n].stage = s;
    hs[n].t_f = c->t_f[s];
    hs[n].t_b = c->t_b[s];
    hs[n].t_w = c->t_w[s];
    hs[n].m_f = c->m_f[s];
    hs[n].m_b = c->m_b[s];
    hs[n].m_w = c->m_w[s];
    hs[n].t_reduce = c->t_reduce[s];
    a->stages[n] = &hs[n];
    n++;
  }
  a->n_stages = n;
}

void zb_assignment_encode(const zb_assignment_src *src, int global, Zb__V1__Assignment *out) {
  const zb_planner_result *pl = src->plan;
  const zb_job_spec *spec = src->spec;
  int rank = zb_dp_pipeline_rank(global, pl->p), replica = zb_dp_replica(global, pl->p);
  zb__v1__assignment__init(out);
  out->job_id = (char *)src->job_id;
  out->rank = rank;
  out->replica = replica;
  out->data_parallel = spec->data_parallel;
  out->zero = spec->zero;
  out->ranks = pl->p;
  out->chunks = pl->v;
  out->microbatches = pl->m;
  /* the family whose lists these are (zb-auto's choice, not "zb-auto"):
   * the worker takes the stages' placement from it */
  out->schedule = (char *)zb_family_name(pl->chosen);
  out->plan_version = src->plan_version;
  out->first_iteration = src->first_iteration;
  out->iterations = spec->iterations;
  out->bytes_per_activation = spec->bytes_per_activation;
  out->backend = (char *)spec->backend;
  out->transport = (char *)spec->transport;
  out->precision = (char *)spec->precision;
  out->trace_every = spec->trace_every;
  out->transfer_timeout_s = spec->transfer_timeout_s;
  if (src->data_secret) {
    out->data_secret.data = (uint8_t *)src->data_secret;
    out->data_secret.len = ZB_DATA_SECRET_BYTES;
  }
  out->action_list = zb_action_list_encode(&pl->lowered->ranks[rank]);
  encode_peers(src, rank, replica, out);
  encode_stages(src, rank, out);
  if (zb_job_spec_trains_model(spec)) {
    /* one block with the message first: encode_clear frees it by out->model */
    zb_wire_model_pb *block = zb_malloc(sizeof *block);
    zb_wire_model_to_pb(&spec->model, block);
    out->model = &block->m;
  }
}

void zb_assignment_encode_clear(Zb__V1__Assignment *out) {
  zb_action_list_free(out->action_list);
  if (out->n_peers)
    free(out->peers[0]);
  free(out->peers);
  if (out->n_stages)
    free(out->stages[0]);
  free(out->stages);
  free(out->model);
  out->action_list = NULL;
  out->peers = NULL;
  out->stages = NULL;
  out->model = NULL;
  out->n_peers = out->n_stages = 0;
}

size_t zb_assignment_wire_size(const zb_assignment_src *src, int rank) {
  Zb__V1__Assignment a;
  zb_assignment_encode(src, rank, &a);
  Zb__V1__Command cmd = ZB__V1__COMMAND__INIT;
  cmd.kind_case = ZB__V1__COMMAND__KIND_ASSIGN;
  cmd.assign = &a;
  size_t n = protobuf_c_message_get_packed_size(&cmd.base);
  zb_assignment_encode_clear(&a);
  return n;
}

void zb_assignment_measure(const zb_assignment_src *src, zb_assignment_sizes *out) {
  memset(out, 0, sizeof *out);
  for (int r = 0; r < src->plan->p; r++) {
    size_t n = zb_assignment_wire_size(src, r);
    out->total += n;
    if (n > out->largest) {
      out->largest = n;
      out->largest_rank = r;
    }
  }
}
