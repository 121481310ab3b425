/* zb_collective.h — ring collectives over a zb_transport (docs/model.md,
 * Transports, Ring collectives): reduce-scatter, all-gather and all-reduce
 * of float32 buffers across a group of ranks, the data-parallel replicas
 * of one stage (global rank g = replica * p + r; the group of pipeline
 * rank r is {r, p + r, 2p + r, ...}).
 *
 * Algorithm: the bandwidth-optimal ring (Patarasuk and Yuan; NCCL's
 * ring). The buffer of n floats is cut into d shards (zb_ring_shard);
 * member i sends to member i+1 and receives from member i-1 (mod d).
 *   - reduce-scatter: d-1 steps; at step s member i sends its partial sum
 *     of shard (i-s-1) mod d and adds the one of shard (i-s-2) mod d it
 *     receives to its own. Afterwards member i's shard i holds the sum
 *     over members, accumulated in one fixed order: shard j is summed as
 *     ((x[j+1] + x[j+2]) + ...) + x[j] (member indices mod d), once, by
 *     one member.
 *   - all-gather: d-1 steps; at step s member i sends shard (i-s) mod d
 *     and receives shard (i-s-1) mod d straight into place.
 *   - all-reduce: reduce-scatter, then all-gather. Every member ends with
 *     the same bits (each shard is summed once, then only copied), and
 *     each sends (and receives) 2(d-1)/d of the buffer: 2(d-1)/d * 4n
 *     payload bytes, the least any all-reduce can.
 *
 * Slices: each ring step moves its shard in slices of at most slice_bytes
 * (ZB_RING_SLICE_BYTES by default). A slice's send and receive are posted
 * in one transport group, so they progress together (a ring of blocking
 * sends would deadlock), and the socket buffers carry the next slice while
 * the previous one is added. Memory: one slice of scratch per
 * reduce-scatter (the received partial sum), allocated by the call and
 * freed before it returns; all-gather receives in place and needs none.
 *
 * Tags: every message is tagged (ZB_OP_REDUCE_GRAD, stage, seq): kind
 * REDUCE_GRAD is never an activation's (F), a gradient's (B) or the step
 * chain's (F/B of stage -1), stage tells two groups sharing a transport
 * apart, and seq numbers the collective. On tcp a message whose tag or
 * length differs from the receiver's fails as ZB_ERR_INVALID_SCHEDULE
 * naming both tags; nccl cannot check tags (zb_transport.h).
 *
 * Contract: like NCCL's collectives, every member calls the same
 * collectives in the same order with the same n, stage and seq, and
 * members must be connected to their ring neighbours (ranks[index+1] and
 * ranks[index-1]). Calls block until done (the transport's groups).
 *
 * Failure: the transport's errors pass through, naming the peer; a
 * failed transport is poisoned and shuts its connections, so the other
 * members fail promptly too (naming this one, or a neighbour that failed
 * in turn), never hang. Bad arguments (ZB_ERR_INVALID_ARG: a size below
 * 1, an index out of range, no ranks, no buffer, a slice under 4 bytes)
 * abort the transport for the same reason, before any message. d = 1
 * moves nothing and returns ZB_OK.
 *
 * Ownership: zb_ring is a plain struct the caller fills and owns; it
 * borrows the transport and the ranks array (size entries), which must
 * outlive every call. The caller's buffer is only used during a call. One
 * thread uses a ring (and its transport) at a time.
 *
 * Results: zb_err from lib/zb_err.h (see Failure).
 */
#ifndef ZB_COLLECTIVE_H
#define ZB_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "zb_transport.h"

/* The default slice: 1 MiB (262144 floats), a quarter of the tcp
 * transport's socket buffers (TCP_SOCKET_BUFFER), so a whole slice fits in
 * flight while the previous one is summed. */
#define ZB_RING_SLICE_BYTES ((size_t)1 << 20)

typedef struct zb_ring {
  zb_transport *tr;   /* borrowed */
  int size;           /* d: members of the group, >= 1 */
  int index;          /* this member's index, 0 <= index < size */
  const int *ranks;   /* borrowed: the transport rank of member i is ranks[i] */
  int32_t stage;      /* the tags' stage: the pipeline stage the group reduces */
  int32_t seq;        /* the tags' mb: the next collective's number; each call advances it by 1 */
  size_t slice_bytes; /* at most this much per message (rounded down to floats); 0: ZB_RING_SLICE_BYTES */
} zb_ring;

/* Member i's shard of an n-float buffer split d ways: [*off, *off + *len).
 * The first n % d shards hold n / d + 1 floats, the others n / d, in
 * member order, so shards tile the buffer; with n < d the last d - n are
 * empty. Requires d >= 1 and 0 <= i < d. Pure. */
void zb_ring_shard(size_t n, int d, int i, size_t *off, size_t *len);

/* Reduce-scatter (sum) of buf's n floats: afterwards member index's shard
 * of buf holds the sum over members of that shard; the rest of buf holds
 * partial sums (garbage to the caller). Advances seq by 1. */
zb_err zb_ring_reduce_scatter(zb_ring *g, float *buf, size_t n, zb_diag *diag);

/* All-gather of buf's n floats: member i's shard of member i's buf is
 * copied into every member's buf. Advances seq by 1. */
zb_err zb_ring_all_gather(zb_ring *g, float *buf, size_t n, zb_diag *diag);

/* All-reduce (sum) of buf's n floats: reduce-scatter, then all-gather;
 * every member ends with the same bits. Advances seq by 2. */
zb_err zb_ring_all_reduce(zb_ring *g, float *buf, size_t n, zb_diag *diag);

#endif
