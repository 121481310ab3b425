"""Adaptive re-planning (docs/wire.md, Timelines): a zb-auto job whose
rank 1 slows by 1.3x from iteration 3 (test knobs ZB_TEST_SIM_SLOWDOWN and
ZB_TEST_SIM_SLOWDOWN_FROM) is re-planned under the learned costs at an
iteration boundary, with an event saying so, and runs faster than the same
job with adaptation off; with steady costs nothing is re-planned (no
flapping); a zb-h1 job does not adapt unless asked; bad adaptive settings
are refused naming the field. The zb-auto jobs here keep one chunk per
rank (chunks: 1; without it zb-auto searches every placement), so the
re-plan is zb-auto's own on loop placement."""

import zbsvc
from zbsvc import SLOW, STATE, Cluster, zb_pb2

T = 0.03


def spec(name, iterations, enabled=None, schedule="zb-auto"):
    js = zbsvc.job_spec(name=name, ranks=4, microbatches=8, schedule=schedule, t=T, iterations=iterations)
    js.trace_every = 1
    if schedule == "zb-auto":
        js.chunks = 1
    if enabled is not None:
        js.adaptive.mode = zb_pb2.ADAPTIVE_MODE_ON if enabled else zb_pb2.ADAPTIVE_MODE_OFF
    return js


def replans(c, jid):
    return [e.reason for e in c.events(jid) if e.reason.startswith("adaptive re-plan")]


def walls(c, jid, first):
    return [it.wall_seconds for it in zbsvc.iteration_events(c.events(jid)) if it.iteration >= first]


def slow_second_cluster(name):
    """4 workers; the second to attach (rank 1 of a 4-rank job) slows 1.3x from iteration 3."""
    c = Cluster(workers=1, name=name).__enter__()
    try:
        c.start_worker("w-slow", env={"ZB_TEST_SIM_SLOWDOWN": "1.3", "ZB_TEST_SIM_SLOWDOWN_FROM": "3"})
        c.wait_workers(2)
        c.start_worker("w2")
        c.wait_workers(3)
        c.start_worker("w3")
        c.wait_workers(4)
    except BaseException:
        c.__exit__(None, None, None)
        raise
    return c


def test_drift_is_replanned_and_runs_faster():
    c = slow_second_cluster("adapt-drift")
    try:
        static = c.submit(spec("static", 14, enabled=False))
        c.wait_state(static, STATE.JOB_STATE_SUCCEEDED, timeout=180)
        assert replans(c, static) == []
        c.wait_workers(4)
        adaptive = c.submit(spec("adaptive", 14))  # zb-auto: on by default
        c.wait_state(adaptive, STATE.JOB_STATE_SUCCEEDED, timeout=180)
        last = zbsvc.iteration_events(c.events(adaptive))[-1]
        assert [r.rank for r in last.ranks if r.slowdown > 1.2] == [1], [(r.rank, r.slowdown) for r in last.ranks]
        rs = replans(c, adaptive)
        print("re-plans:", rs)
        assert len(rs) == 1, rs  # once, then steady under the new costs
        assert "from iteration" in rs[0] and "zb-auto" in rs[0], rs
        at = int(rs[0].split("from iteration ")[1].split(":")[0])
        assert at >= 4, rs  # not before the drift was seen
        a, s = walls(c, adaptive, at + 1), walls(c, static, at + 1)
        med = lambda v: sorted(v)[len(v) // 2]
        print("median iteration after the switch: adaptive %.4f s, static %.4f s, ratio %.4f" %
              (med(a), med(s), med(a) / med(s)))
        assert med(a) < med(s), (a, s)
        job = c.get(adaptive)
        assert job.spec.schedule == "zb-auto" and job.schedule == "zb-auto", job
    finally:
        c.__exit__(None, None, None)


def test_steady_costs_no_replan():
    with Cluster(workers=4, name="adapt-steady") as c:
        jid = c.submit(spec("steady", 12))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=180)
        assert replans(c, jid) == [], replans(c, jid)
        # a zb-h1 job with the same drift-free costs: not adaptive unless asked
        jid = c.submit(spec("h1", 3, schedule="zb-h1"))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        assert replans(c, jid) == []


def test_bad_adaptive_settings_refused():
    with Cluster(workers=0, name="adapt-bad") as c:
        for field, value, needle in (("min_gain", 1.5, "adaptive.min_gain"), ("min_gain", -0.1, "adaptive.min_gain"),
                                     ("check_every", -3, "adaptive.check_every"), ("mode", 7, "adaptive.enabled")):
            js = spec("bad", 3)
            if field == "min_gain":
                js.adaptive.min_gain.value = value
            else:
                setattr(js.adaptive, field, value)
            code, details = zbsvc.rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(spec=js), timeout=10 * SLOW)
            assert "INVALID_ARGUMENT" in str(code) and needle in details, (code, details)
        c.assert_serving()


def test_yaml_settings_survive_the_wire():
    """adaptive keys given without `enabled` (and min_gain 0) reach the
    coordinator as written; `enabled` absent keeps the family's default."""
    with Cluster(workers=1, name="adapt-yaml") as c:
        for text, mode, gain, every in (
                ("  min_gain: 0.1\n  check_every: 3\n", zb_pb2.ADAPTIVE_MODE_DEFAULT, 0.1, 3),
                ("  enabled: false\n  min_gain: 0\n", zb_pb2.ADAPTIVE_MODE_OFF, 0.0, 1),
                ("  enabled: true\n", zb_pb2.ADAPTIVE_MODE_ON, 0.02, 1)):
            path = c.dir + "/adaptive.yaml"
            with open(path, "w") as f:
                f.write("name: y\nranks: 1\nmicrobatches: 2\nschedule: zb-auto\nadaptive:\n" + text)
            out = c.zbctl("submit", path)
            assert out.returncode == 0, out.stderr
            job = c.get(out.stdout.strip().split()[-1])
            a = job.spec.adaptive
            assert (a.mode, round(a.min_gain.value, 9), a.check_every) == (mode, gain, every), (text, a)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
