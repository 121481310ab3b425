/* zb_timeline_pb.h — a rank's per-op timeline (lib/zb_timeline.h) as the
 * wire's OpTimeline columns and back (docs/wire.md, Timelines). The worker
 * encodes, the coordinator copies and decodes, zbctl decodes.
 *
 * Ownership: encode and copy return a message whose every array, and the
 * message itself, come from malloc, so protobuf_c_message_free_unpacked
 * (default allocator) or zb_timeline_pb_free frees it like an unpacked one.
 */
#ifndef ZB_TIMELINE_PB_H
#define ZB_TIMELINE_PB_H

#include "zb/v1/zb.pb-c.h"
#include "zb_timeline.h"

/* ops[0..n) with times in seconds from the rank's iteration start, as
 * whole microseconds (a time beyond 2^32 us is clamped). */
Zb__V1__OpTimeline *zb_timeline_encode(const zb_tl_op *ops, int n);

/* A deep copy of t (NULL for NULL). */
Zb__V1__OpTimeline *zb_timeline_pb_copy(const Zb__V1__OpTimeline *t);

void zb_timeline_pb_free(Zb__V1__OpTimeline *t);

/* Decodes t into *ops (allocated, *n entries; the caller frees), each time
 * base + microseconds * 1e-6. ZB_ERR_INVALID_ARG naming the field
 * ("timeline.kind[3]: ...") when the columns differ in length, a kind is
 * not F, B, W, BW, SEND_* or RECV_*, or a compute op has a group size or
 * a group none. */
zb_err zb_timeline_decode(const Zb__V1__OpTimeline *t, double base, zb_tl_op **ops, int *n, zb_diag *diag);

#endif
