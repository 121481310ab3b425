/* heartbeat.h — the heartbeat period the coordinator asks of its workers
 * (docs/wire.md, Heartbeats). Every heartbeat is a Report the coordinator
 * answers, so a fixed period makes its idle cost grow with the workers:
 * the period it asks for grows with them instead, within bounds that keep
 * a silent worker detected within heartbeat_timeout_ms. Pure: no state. */
#ifndef ZB_COORD_HEARTBEAT_H
#define ZB_COORD_HEARTBEAT_H

/* The period grows by this much per attached worker: about 200
 * heartbeats a second in all, until the bound below. */
enum { COORD_HEARTBEAT_MS_PER_WORKER = 5 };

/* The period (ms) to ask of `attached` workers under heartbeat timeout
 * timeout_ms, given the one asked now (current_ms; 0: none yet): 5 ms per
 * worker, at least a fifth of the timeout (a worker's own default period
 * under the default timeout) and at most two fifths, so one heartbeat may
 * be lost or late, with the control loop's 200 ms of jitter, and the next
 * still comes within the timeout. Between the bounds it moves only once
 * the target is 20% away, so workers coming and going one at a time do not
 * have every worker told a new period again and again. */
int coord_heartbeat_period(int timeout_ms, int attached, int current_ms);

#endif
