"""The gradient reduction's place in the timeline (docs/schedules.md,
Gradient reduction): a sim job of data_parallel 2 with costs.reduce, traced
every iteration. The lowered plan puts one REDUCE_GRAD per hosted stage
right after that stage's last W and one WAIT_REDUCE_GRAD last; the workers'
measured timelines show each reduction there, lasting its T_reduce (the
replicas meet in a real ring all-reduce, then the sim holds the rank); and
the measured bubble is within the timeline test's tolerance of the
simulator's, which models the reduction holding the rank (tcp is
host-blocking), so the three agree on where the reduction falls."""

import zbsvc
from zbsvc import SLOW, STATE, Cluster, zb_pb2

TOL = 0.03  # as tests/service/test_timelines.py
T_OP = 0.04
K = zb_pb2
REDUCE = K.ACTION_KIND_REDUCE_GRAD
WAIT = K.ACTION_KIND_WAIT_REDUCE_GRAD
WEIGHT = (K.ACTION_KIND_W, K.ACTION_KIND_BW)


def spec(family, reduce_s):
    js = zbsvc.job_spec(name="red-" + family, ranks=2, microbatches=4, schedule=family, t=T_OP, iterations=3,
                        data_parallel=2)
    js.costs.t_reduce = reduce_s
    js.trace_every = 1
    return js


def check_list(kinds, stages):
    """The lowered list: one REDUCE_GRAD per hosted stage, after the
    stage's last W or BW; one WAIT_REDUCE_GRAD, last. Returns the reduced
    stages in list order."""
    reduced = []
    for i, k in enumerate(kinds):
        if k == REDUCE:
            s = stages[i]
            assert s not in reduced, (i, s)
            last_w = max(j for j in range(len(kinds)) if kinds[j] in WEIGHT and stages[j] == s)
            # right after the stage's last W: only other stages' reductions between
            assert all(kinds[j] == REDUCE for j in range(last_w + 1, i)), (i, last_w, kinds)
            reduced.append(s)
    assert kinds[-1] == WAIT and list(kinds).count(WAIT) == 1, kinds
    hosted = {stages[i] for i, k in enumerate(kinds) if k in WEIGHT}
    assert sorted(reduced) == sorted(hosted), (reduced, hosted)
    return reduced


def check_timeline(tl, per_stage):
    """Measured: each REDUCE_GRAD starts after its stage's last W ends and
    lasts at least its T_reduce."""
    rows = list(zip(tl.kind, tl.stage, tl.start_us, tl.duration_us))
    reds = [r for r in rows if r[0] == REDUCE]
    for k, s, start, dur in reds:
        w_end = max(st + du for kk, ss, st, du in rows if kk in WEIGHT and ss == s)
        # start and duration are each rounded to whole microseconds on the wire
        assert start >= w_end - 2, (s, start, w_end)
        assert dur >= 0.95 * per_stage * 1e6, (s, dur, per_stage)
    return len(reds)


def run(c, family, v):
    reduce_s = 2 * T_OP  # one rank's whole share; per chunk reduce_s / v
    js = spec(family, reduce_s)
    plan = c.stub.Plan(zb_pb2.PlanRequest(spec=js, with_action_lists=True), timeout=30 * SLOW)
    for al in plan.action_lists:
        check_list(list(al.kind), list(al.stage))
    jid = c.submit(js)
    c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
    its = zbsvc.iteration_events(c.events(jid))
    assert len(its) == 3 and all(it.aligned for it in its), [(it.iteration, it.aligned) for it in its]
    for it in its[1:]:
        for ri in it.ranks:
            assert check_timeline(ri.timeline, reduce_s / v) == v, ri.rank
    best = min(its[1:], key=lambda it: abs(it.bubble_ratio - it.predicted_bubble_ratio))
    print("%-6s measured bubble %.4f predicted %.4f" % (family, best.bubble_ratio, best.predicted_bubble_ratio))
    assert abs(best.bubble_ratio - best.predicted_bubble_ratio) <= TOL, (best.bubble_ratio,
                                                                         best.predicted_bubble_ratio)
    # the reduction is in the prediction: without it the same plan predicts less bubble
    bare = c.stub.Plan(zb_pb2.PlanRequest(spec=spec(family, 0.0)), timeout=30 * SLOW)
    assert plan.makespan > bare.makespan + 0.5 * reduce_s / v, (plan.makespan, bare.makespan)


def test_reduction_in_plan_timeline_and_simulator():
    with Cluster(workers=4, name="red-tl") as c:
        run(c, "zb-h1", 1)
        run(c, "zb-v", 2)
        c.assert_serving()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
