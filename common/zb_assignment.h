/* zb_assignment.h — the one codec of zb.v1.Assignment, a rank's part of a
 * job (docs/wire.md, Assignment). The coordinator encodes, the worker
 * decodes, and nothing else touches the message's fields.
 *
 * A rank receives only what it needs, so a job's assignments grow
 * linearly with its ranks:
 *   - its lowered action list as columns (kind, stage, microbatch, peer,
 *     group_with_next): exactly the planner's list, transport groups
 *     included, so the worker posts the groups the planner formed;
 *   - the data addresses of the ranks it exchanges tensors with, and of
 *     rank +-1 (the cpu backend's optimizer reduces along the ranks);
 *   - the costs of the stages it hosts;
 *   - the job's scalars (precision included) and, for a cpu or cuda job,
 *     the resolved model.
 * The decoder still reads the older all-ranks form (action strings, peer
 * addresses by rank, costs of every stage) when action_list is absent;
 * action strings carry no groups, so every comm action of such a list is
 * a group of its own.
 *
 * Ownership: zb_assignment_encode fills a caller-provided message whose
 * arrays and submessages it allocates; zb_assignment_encode_clear frees
 * them (not the strings, which point into the source). A decoded
 * zb_assignment owns everything it holds; zb_assignment_free releases it
 * (also after a failed decode and on a zeroed one).
 */
#ifndef ZB_ASSIGNMENT_H
#define ZB_ASSIGNMENT_H

#include <stddef.h>

#include "zb/v1/zb.pb-c.h"
#include "zb_jobspec.h"
#include "zb_planner.h"

/* Bytes of an NCCL bootstrap id (nccl.h's NCCL_UNIQUE_ID_BYTES), as
 * ReportRequest.nccl_unique_id and Command.nccl_id carry it (docs/wire.md,
 * NCCL id exchange). The nccl transport checks that the two agree. */
#define ZB_NCCL_ID_BYTES 128

/* What the coordinator assigns from: the job, its plan and its workers. */
/* A job's data-plane secret (Assignment.data_secret). */
enum { ZB_DATA_SECRET_BYTES = 32 };

typedef struct zb_assignment_src {
  const char *job_id;
  const zb_job_spec *spec; /* iterations, backend, transport, precision, bytes per activation, model */
  const zb_planner_result *plan;
  /* data address by global rank (data_parallel x plan->p, zb_jobspec_dp.h);
   * NULL: not known yet */
  const char *const *addresses;
  int plan_version;    /* 1, then +1 per schedule update */
  int first_iteration; /* the first iteration that runs this plan */
  /* every rank's address, not only the neighbours': an update that moves
   * stages between ranks, whose weights may go to any rank */
  bool all_peers;
  /* the model's head is tied to its embedding over several stages: the
   * ranks of the first and the last stage exchange its gradient each
   * iteration (docs/model.md, Tied head), so they are peers */
  bool tied_ends;
  const uint8_t *data_secret; /* ZB_DATA_SECRET_BYTES; NULL: none sent */
} zb_assignment_src;

/* Fills *out with the Assignment of global rank `global` (replica x p +
 * pipeline rank): rank and ranks are the pipeline rank and p, replica,
 * data_parallel and zero say the rest, and its peers are named by global
 * rank within its replica. Does not fail: the plan is the planner's and
 * the spec was checked at submission. */
void zb_assignment_encode(const zb_assignment_src *src, int global, Zb__V1__Assignment *out);
void zb_assignment_encode_clear(Zb__V1__Assignment *out);

/* Packed size of rank's Assignment inside a Command, as it goes on the
 * Attach stream (every replica's is the same size). */
size_t zb_assignment_wire_size(const zb_assignment_src *src, int rank);

/* The largest (and its pipeline rank) and the total wire size over one
 * replica's ranks. */
typedef struct zb_assignment_sizes {
  size_t largest, total;
  int largest_rank;
} zb_assignment_sizes;
void zb_assignment_measure(const zb_assignment_src *src, zb_assignment_sizes *out);

/* libzb's op as the wire's ActionKind (UNSPECIFIED for FSDP and empty
 * ops), and back (false for a kind that is none of F, B, W, BW, SEND_*,
 * RECV_*). */
Zb__V1__ActionKind zb_action_kind_of(zb_op op);
bool zb_action_op_of(Zb__V1__ActionKind k, zb_op *op);

/* A rank's lowered list as ActionList columns, groups included (also what
 * PlanResponse.action_lists carries); allocated, freed by
 * zb_action_list_free (NULL is a no-op). */
Zb__V1__ActionList *zb_action_list_encode(const zb_rank_list *l);
void zb_action_list_free(Zb__V1__ActionList *al);

/* A decoded Assignment: plain C types, checked. */
typedef struct zb_assignment {
  char job_id[64];
  int rank, ranks, chunks, microbatches; /* rank: the pipeline rank; ranks: the plan's p */
  int replica, data_parallel, zero;      /* data parallelism (0 from an older coordinator: 0, 1, 0) */
  zb_family family;
  char schedule[32];
  int plan_version, first_iteration, iterations;
  long long bytes_per_activation;
  char backend[16], transport[16];
  char precision[8];      /* "fp32" (also when the coordinator sent none), "tf32", "bf16" */
  int trace_every;        /* timelines of iterations 0, N, 2N, ...; 0: none */
  int transfer_timeout_s; /* an nccl transfer group's bound (JobSpec.transfer_timeout_s) */
  /* p ranks, `chunks` stages each, m microbatches; only rank's list is
   * filled (peers and groups as planned) */
  zb_schedule *sched;
  zb_costs *costs;       /* all p*chunks stages; those rank does not host are zero */
  char **peer_addresses; /* by global rank (data_parallel x ranks entries); NULL where not sent */
  bool has_model;        /* a cpu or cuda job: model is resolved over the defaults */
  zb_model_spec model;
  /* the job's data secret; has_data_secret false from an older coordinator */
  bool has_data_secret;
  uint8_t data_secret[ZB_DATA_SECRET_BYTES];
} zb_assignment;

/* Decodes and checks pb: shape and schedule, every action in range (a
 * known kind, a stage of the plan, a microbatch below m, a peer that is
 * another rank), columns of equal length, the hosted stages' costs. Fails
 * with ZB_ERR_INVALID_ARG (or ZB_ERR_PARSE for a bad old-form action
 * string) naming the field, "assignment.action_list[17]: ...". */
zb_err zb_assignment_decode(const Zb__V1__Assignment *pb, zb_assignment *out, zb_diag *diag);
void zb_assignment_free(zb_assignment *a);

/* The data address of global rank q, or NULL when the Assignment did not
 * name it. */
const char *zb_assignment_peer(const zb_assignment *a, int q);
/* This rank's global rank and the job's ranks over all replicas. */
int zb_assignment_global(const zb_assignment *a);
int zb_assignment_world(const zb_assignment *a);

#endif
