"""Per-op timelines (docs/wire.md, Timelines): sim-backend jobs at p = 4
and 8 in several families, traced every iteration; the coordinator places
the ranks' timelines on its clock, and the measured bubble_ratio (and the
paper's) from them is within 0.03 of the simulator's prediction. A worker
whose clock is skewed by 5 s (test knob ZB_TEST_CLOCK_SKEW_SECONDS) is
corrected by the round-trip offset estimate; timelines hold every op of
the plan. Costs learned from the timelines are within 10% of the sim
backend's configured op times, and the predicted bubble is re-simulated
from them; a rank slowed by 1.5x (test knob ZB_TEST_SIM_SLOWDOWN) is named
a straggler within 10 iterations, and the learned prediction still
matches the measured bubble."""

import zbsvc
from zbsvc import SLOW, STATE, Cluster, zb_pb2

TOL = 0.03
T_OP = 0.04  # seconds per F, B, W (one rank's share): large against a loopback hop and a sleep's overshoot


def spec(family, p, m, iterations=3, trace_every=1):
    js = zbsvc.job_spec(name="tl-%s-p%d" % (family, p), ranks=p, microbatches=m, schedule=family, t=T_OP,
                        iterations=iterations)
    js.trace_every = trace_every
    return js


def compute_ops(actions):
    kinds = (zb_pb2.ACTION_KIND_F, zb_pb2.ACTION_KIND_B, zb_pb2.ACTION_KIND_W, zb_pb2.ACTION_KIND_BW)
    return sum(1 for k in actions.kind if k in kinds)


def run_and_check(c, family, p, m, rows):
    js = spec(family, p, m)
    plan = c.stub.Plan(zb_pb2.PlanRequest(spec=js, with_action_lists=True), timeout=30 * SLOW)
    jid = c.submit(js)
    c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
    its = zbsvc.iteration_events(c.events(jid))
    assert len(its) == 3 and all(it.aligned for it in its), [(it.iteration, it.aligned) for it in its]
    for it in its[1:]:  # iteration 0 includes connecting
        rows.append((family, p, m, it.iteration, it.bubble_ratio, it.predicted_bubble_ratio,
                     it.bubble_ratio_paper, it.predicted_bubble_ratio_paper))
    # the better of iterations 1 and 2: a rank descheduled on a loaded
    # machine delays one iteration, not the pipeline's shape
    best = min(its[1:], key=lambda it: abs(it.bubble_ratio - it.predicted_bubble_ratio))
    assert abs(best.bubble_ratio - best.predicted_bubble_ratio) <= TOL, rows[-2:]
    assert abs(best.bubble_ratio_paper - best.predicted_bubble_ratio_paper) <= TOL, rows[-2:]
    for it in its[1:]:
        for ri in it.ranks:
            assert len(ri.timeline.kind) >= compute_ops(plan.action_lists[ri.rank]), ri.rank
            n_compute = sum(1 for g in ri.timeline.group_size if g == 0)
            assert n_compute == compute_ops(plan.action_lists[ri.rank]), (ri.rank, n_compute)
            total = ri.span_compute_seconds + ri.span_comm_seconds + ri.span_idle_seconds
            assert abs(total - it.span_seconds) < 1e-6 or ri.span_idle_seconds == 0, (ri, it.span_seconds)
    return jid


def print_rows(rows):
    print("%-17s %2s %3s %4s %9s %9s %9s %9s" % ("family", "p", "m", "it", "measured", "predicted",
                                                   "paper", "predicted"))
    for r in rows:
        print("%-17s %2d %3d %4d %9.4f %9.4f %9.4f %9.4f" % r)


def test_aligned_bubble_matches_the_simulator_p4():
    rows = []
    with Cluster(workers=4, name="tl-p4") as c:
        for family in ("1f1b", "zb-h1", "zb-h2", "zb-v", "interleaved-1f1b"):
            run_and_check(c, family, 4, 8, rows)
    print_rows(rows)


def test_aligned_bubble_matches_the_simulator_p8():
    rows = []
    with Cluster(workers=8, name="tl-p8") as c:
        for family in ("1f1b", "zb-h1", "zb-v"):
            run_and_check(c, family, 8, 16, rows)
    print_rows(rows)


def test_skewed_clock_is_corrected():
    with Cluster(workers=3, name="tl-skew") as c:
        c.start_worker("w-skewed", env={"ZB_TEST_CLOCK_SKEW_SECONDS": "5"})
        c.wait_workers(4)
        rows = []
        jid = run_and_check(c, "zb-h1", 4, 8, rows)
        print_rows(rows)
        last = zbsvc.iteration_events(c.events(jid))[-1]
        skewed = [ri for ri in last.ranks if abs(ri.clock_offset_seconds + 5) < 0.05]
        others = [ri for ri in last.ranks if abs(ri.clock_offset_seconds) < 0.05]
        assert len(skewed) == 1 and len(others) == 3, [(ri.rank, ri.clock_offset_seconds) for ri in last.ranks]
        print("offsets:", [(ri.rank, round(ri.clock_offset_seconds, 6), ri.clock_rtt_seconds) for ri in last.ranks])
        # without the correction the skewed rank's ops would sit 5 s away
        starts = sorted(ri.start_monotonic_seconds for ri in last.ranks)
        assert starts[-1] - starts[0] > 4.5, starts
        assert last.span_seconds < 2.0, last.span_seconds


def test_get_iteration_and_refusals():
    with Cluster(workers=2, name="tl-get") as c:
        jid = c.submit(spec("1f1b", 2, 4, iterations=5, trace_every=2))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        its = zbsvc.iteration_events(c.events(jid))
        assert [it.aligned for it in its] == [True, False, True, False, True], [it.aligned for it in its]
        assert all(len(ri.timeline.kind) == 0 for ri in its[1].ranks)
        last = c.stub.GetIteration(zb_pb2.GetIterationRequest(job_id=jid, iteration=-1), timeout=10 * SLOW)
        assert last.iteration == 4 and last.aligned, last.iteration
        one = c.stub.GetIteration(zb_pb2.GetIterationRequest(job_id=jid, iteration=1), timeout=10 * SLOW)
        assert one.iteration == 1 and not one.aligned
        code, details = zbsvc.rpc_error(c.stub.GetIteration, zb_pb2.GetIterationRequest(job_id=jid, iteration=9),
                                        timeout=10 * SLOW)
        assert "NOT_FOUND" in str(code) and "iteration 9" in details, (code, details)
        code, details = zbsvc.rpc_error(c.stub.GetIteration, zb_pb2.GetIterationRequest(job_id=jid, iteration=-2),
                                        timeout=10 * SLOW)
        assert "INVALID_ARGUMENT" in str(code), (code, details)
        # no trace at all
        js = spec("1f1b", 2, 4, iterations=2, trace_every=-1)
        jid2 = c.submit(js)
        c.wait_state(jid2, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        assert not any(it.aligned for it in zbsvc.iteration_events(c.events(jid2)))
        code, details = zbsvc.rpc_error(c.stub.GetIteration, zb_pb2.GetIterationRequest(job_id=jid2, iteration=-1),
                                        timeout=10 * SLOW)
        assert "NOT_FOUND" in str(code) and "no traced iteration" in details, (code, details)
        c.assert_serving()


def test_learned_costs_within_10_percent():
    with Cluster(workers=4, name="tl-learn") as c:
        js = zbsvc.job_spec(name="learn", ranks=4, microbatches=8, schedule="zb-h1", t_f=0.03, t_b=0.04,
                            t_w=0.02, iterations=4)
        js.trace_every = 1
        jid = c.submit(js)
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
        job = c.get(jid)
        assert job.learned.iterations == 4 and len(job.learned.stages) == 4, job.learned
        for s, st in enumerate(job.learned.stages):
            for got, want in ((st.t_f, 0.03), (st.t_b, 0.04), (st.t_w, 0.02)):
                assert abs(got - want) <= 0.1 * want, (s, got, want)
        assert job.learned.t_comm < 0.005, job.learned.t_comm  # loopback hops
        last = zbsvc.iteration_events(c.events(jid))[-1]
        assert last.predicted_from_learned and not last.straggler_ranks, last
        print("learned:", [(round(st.t_f, 4), round(st.t_b, 4), round(st.t_w, 4)) for st in job.learned.stages],
              "t_comm", job.learned.t_comm)
        out = c.zbctl("get", jid)
        assert out.returncode == 0 and "learned    from 4 sampled iteration(s)" in out.stdout, out.stdout
        assert "timelines: span" in out.stdout, out.stdout


def test_straggler_named_within_10_iterations():
    with Cluster(workers=3, name="tl-straggler") as c:
        c.start_worker("w-slow", env={"ZB_TEST_SIM_SLOWDOWN": "1.5"})
        c.wait_workers(4)
        js = spec("zb-h1", 4, 8, iterations=10, trace_every=1)
        jid = c.submit(js)
        c.wait_iterations(jid, 3, timeout=60)
        flags = {dict(lab)["rank"]: v
                 for lab, v in zbsvc.series(zbsvc.parse_metrics(c.metrics()[2]), "zb_rank_straggler", job_id=jid).items()}
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
        its = zbsvc.iteration_events(c.events(jid))
        named = [(it.iteration, list(it.straggler_ranks)) for it in its if it.straggler_ranks]
        assert named, "no straggler named in 10 iterations"
        slow_rank = named[0][1]
        assert len(slow_rank) == 1, named
        slowdowns = {ri.rank: round(ri.slowdown, 3) for ri in its[-1].ranks}
        assert slowdowns[slow_rank[0]] > 1.35, slowdowns
        print("stragglers by iteration:", named[:3], "slowdowns:", slowdowns)
        # the rank it names runs on the slowed worker (its job rank is in the worker list while running: use
        # the events' per-rank compute instead: the slow rank computes 1.5x as long as the others)
        comp = {ri.rank: ri.span_compute_seconds for ri in its[-1].ranks}
        assert comp[slow_rank[0]] == max(comp.values()), comp
        last = its[-1]
        assert last.predicted_from_learned, last
        assert abs(last.bubble_ratio - last.predicted_bubble_ratio) <= TOL, (last.bubble_ratio,
                                                                           last.predicted_bubble_ratio)
        out = c.zbctl("watch", jid)
        assert "straggler: rank %d computes" % slow_rank[0] in out.stdout, out.stdout
        # the metric named it while the job ran
        assert flags == {str(r): (1.0 if r == slow_rank[0] else 0.0) for r in range(4)}, flags


if __name__ == "__main__":
    zbsvc.run_tests(globals())
