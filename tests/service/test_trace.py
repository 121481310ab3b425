"""zbctl trace (client/trace.c): a traced iteration of a sim-backend job as
a Chrome trace (the planned timeline, simulated from the job's costs,
beside the measured one) and as an SVG; --iteration picks the iteration;
an untraced iteration, a job with no traced iteration yet, an unknown job
and bad flags are refused with the server's or zbctl's message."""

import json
import os
import tempfile
import xml.etree.ElementTree as ET

import zbsvc
from zbsvc import SLOW, STATE, Cluster, zb_pb2

T_OP = 0.005
COMPUTE = ("F", "B", "W", "BW")
KINDS = (zb_pb2.ACTION_KIND_F, zb_pb2.ACTION_KIND_B, zb_pb2.ACTION_KIND_W, zb_pb2.ACTION_KIND_BW)


def spec(family, p, m, iterations=5, trace_every=2):
    js = zbsvc.job_spec(name="trace-%s-p%d" % (family, p), ranks=p, microbatches=m, schedule=family, t=T_OP,
                        iterations=iterations)
    js.trace_every = trace_every
    return js


def planned_counts(c, js):
    """Compute actions per rank of the job's plan (the coordinator's)."""
    plan = c.stub.Plan(zb_pb2.PlanRequest(spec=js, with_action_lists=True), timeout=30 * SLOW)
    counts = {}
    for r, al in enumerate(plan.action_lists):
        counts[r] = sum(1 for k in al.kind if k in KINDS)
    return counts


def load_trace(path):
    with open(path) as f:
        return json.load(f)


def process_ids(doc):
    """process name -> pid, from the process_name metadata events."""
    return {e["args"]["name"]: e["pid"] for e in doc["traceEvents"] if e.get("name") == "process_name"}


def events_by_rank(doc, pid, cats):
    out = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["pid"] == pid and e["cat"] in cats:
            out.setdefault(e["tid"], []).append(e)
    return out


def check_trace(c, jid, js, path, iteration):
    doc = load_trace(path)
    procs = process_ids(doc)
    planned = [n for n in procs if n.startswith("planned (%s, simulated from the job's costs)" % js.schedule)]
    measured_name = "measured iteration %d" % iteration
    assert len(planned) == 1 and measured_name in procs, procs
    pid_plan, pid_meas = procs[planned[0]], procs[measured_name]
    assert pid_plan != pid_meas, procs
    want = planned_counts(c, js)
    plan_ops = events_by_rank(doc, pid_plan, COMPUTE)
    meas_ops = events_by_rank(doc, pid_meas, COMPUTE)
    comm = events_by_rank(doc, pid_meas, ("comm",))
    it = c.stub.GetIteration(zb_pb2.GetIterationRequest(job_id=jid, iteration=iteration), timeout=10 * SLOW)
    assert it.aligned and it.iteration == iteration, (it.iteration, it.aligned)
    for r in range(js.ranks):
        assert len(meas_ops.get(r, [])) == want[r], (r, len(meas_ops.get(r, [])), want[r])
        assert len(plan_ops.get(r, [])) == want[r], (r, len(plan_ops.get(r, [])), want[r])
        tl = [ri for ri in it.ranks if ri.rank == r][0].timeline
        assert len(comm.get(r, [])) == sum(1 for g in tl.group_size if g > 0), r
        for e in comm.get(r, []):
            assert e["name"].startswith("comm ") and e["args"]["group_size"] >= 1, e
    every = [e for evs in list(meas_ops.values()) + list(comm.values()) + list(plan_ops.values()) for e in evs]
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in every)
    # both timelines start at 0: the first compute op of each
    assert min(e["ts"] for evs in meas_ops.values() for e in evs) == 0
    assert min(e["ts"] for evs in plan_ops.values() for e in evs) == 0
    # the figures: the coordinator's, and the plan's makespan in microseconds
    meta = [e for e in doc["traceEvents"] if e.get("name") == "process_name" and e["pid"] == pid_meas][0]["args"]
    assert abs(meta["bubble_ratio"] - it.bubble_ratio) < 1e-12, (meta, it.bubble_ratio)
    assert abs(meta["predicted_bubble_ratio"] - it.predicted_bubble_ratio) < 1e-12, meta
    assert abs(meta["span_seconds"] - it.span_seconds) < 1e-12, meta
    assert meta["predicted_from_learned"] == it.predicted_from_learned, meta
    assert doc["otherData"]["iteration"] == iteration, doc["otherData"]
    plan_meta = [e for e in doc["traceEvents"] if e.get("name") == "process_name" and e["pid"] == pid_plan][0]
    end = max(e["ts"] + e["dur"] for evs in plan_ops.values() for e in evs)
    assert abs(end - plan_meta["args"]["makespan_seconds"] * 1e6) < 1e-3, (end, plan_meta)
    # the measured span is about the planned makespan (sleeping ops; iteration 0 includes connecting)
    if iteration > 0:
        assert 0.5 < it.span_seconds / plan_meta["args"]["makespan_seconds"] < 3, (it.span_seconds, plan_meta)
    # a name per kind, as documented
    some = meas_ops[0][0]
    assert some["name"] == "%s s%d mb%d" % (some["cat"], some["args"]["stage"], some["args"]["microbatch"]), some
    return want, it


def check_svg(path, want, it):
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg"), root.tag
    rects = [e for e in root.iter() if e.tag.endswith("rect")]
    ops = [e for e in rects if e.get("class") == "op"]
    comm = [e for e in rects if e.get("class") == "comm"]
    n_compute = sum(want.values())
    n_groups = sum(1 for ri in it.ranks for g in ri.timeline.group_size if g > 0)
    assert len(ops) == 2 * n_compute, (len(ops), n_compute)  # planned + measured
    assert len(comm) == n_groups, (len(comm), n_groups)
    text = " ".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
    assert "measured iteration %d" % it.iteration in text and "bubble_ratio" in text, text[:300]


def run_job(c, tmp, family, p, m):
    js = spec(family, p, m)
    jid = c.submit(js)
    c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
    # default: the last traced iteration (4 of 0..4, trace_every 2), to a file
    out = os.path.join(tmp, "%s.json" % jid)
    cp = c.zbctl("trace", jid, "--output-file", out)
    assert cp.returncode == 0 and cp.stdout == "", (cp.returncode, cp.stdout[:200], cp.stderr)
    assert "warning" not in cp.stderr, cp.stderr
    want, it = check_trace(c, jid, js, out, 4)
    # --iteration picks another traced one; stdout without -o
    cp = c.zbctl("trace", "--iteration", "2", jid)
    assert cp.returncode == 0, cp.stderr
    out2 = os.path.join(tmp, "%s-2.json" % jid)
    with open(out2, "w") as f:
        f.write(cp.stdout)
    check_trace(c, jid, js, out2, 2)
    # the SVG of the same iteration 4
    svg = os.path.join(tmp, "%s.svg" % jid)
    cp = c.zbctl("trace", jid, "-o", "svg", "--output-file", svg)
    assert cp.returncode == 0, cp.stderr
    check_svg(svg, want, it)
    return jid


def test_trace_json_and_svg():
    with Cluster(workers=4, name="trace") as c, tempfile.TemporaryDirectory() as tmp:
        for family, p, m in (("1f1b", 2, 4), ("zb-h1", 3, 6), ("zb-v", 4, 8)):
            jid = run_job(c, tmp, family, p, m)
        # an iteration that ran but was not sampled
        cp = c.zbctl("trace", jid, "--iteration", "3")
        assert cp.returncode == 1, (cp.returncode, cp.stderr)
        assert "iteration 3 was not traced" in cp.stderr and "trace_every 2" in cp.stderr, cp.stderr
        assert cp.stdout == ""
        # one that did not run: the server's message
        cp = c.zbctl("trace", jid, "--iteration", "99")
        assert cp.returncode == 1 and "NOT_FOUND" in cp.stderr and "iteration 99" in cp.stderr, cp.stderr
        c.assert_serving()


def test_trace_after_a_schedule_update():
    """The planned side is the schedule that ran the iteration (zb-h1 runs
    F, B, W; 1f1b F and BW), not the one submitted."""
    with Cluster(workers=2, name="trace-update") as c, tempfile.TemporaryDirectory() as tmp:
        js = spec("zb-h1", 2, 4, iterations=40, trace_every=2)
        jid = c.submit(js)
        c.wait_state(jid, STATE.JOB_STATE_RUNNING, timeout=30)
        r = c.stub.UpdateSchedule(zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="1f1b"), timeout=10 * SLOW)
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
        after = spec("1f1b", 2, 4, iterations=40, trace_every=2)
        for args, want_spec, iteration in (((), after, 38), (("--iteration", "0"), js, 0)):
            out = os.path.join(tmp, "it%d.json" % iteration)
            cp = c.zbctl("trace", jid, "--output-file", out, *args)
            ran = [(it.iteration, it.schedule, it.aligned) for it in zbsvc.iteration_events(c.events(jid))]
            assert cp.returncode == 0 and "warning" not in cp.stderr, (cp.stderr, ran, r.from_iteration)
            check_trace(c, jid, want_spec, out, iteration)
        assert r.from_iteration <= 38, r.from_iteration


def test_trace_refusals():
    with Cluster(workers=2, name="trace-refuse") as c:
        # a job that holds both workers, and one queued behind it: no traced iteration yet
        busy = c.submit(spec("1f1b", 2, 4, iterations=100000, trace_every=0))
        c.wait_state(busy, STATE.JOB_STATE_RUNNING, timeout=30)
        queued = c.submit(spec("1f1b", 2, 4, iterations=2, trace_every=0))
        cp = c.zbctl("trace", queued)
        assert cp.returncode == 1, (cp.returncode, cp.stderr)
        assert "NOT_FOUND" in cp.stderr and "job %s has no traced iteration yet (trace_every 10)" % queued \
            in cp.stderr, cp.stderr
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=busy, reason="test"), timeout=10 * SLOW)
        c.wait_state(queued, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        # a job that traces nothing
        never = c.submit(spec("1f1b", 2, 4, iterations=2, trace_every=-1))
        c.wait_state(never, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        cp = c.zbctl("trace", never)
        assert cp.returncode == 1 and "no traced iteration" in cp.stderr, cp.stderr
        cp = c.zbctl("trace", never, "--iteration", "1")
        assert cp.returncode == 1 and "not traced" in cp.stderr and "trace_every -1" in cp.stderr, cp.stderr
        # no such job
        cp = c.zbctl("trace", "j-999")
        assert cp.returncode == 1 and "NOT_FOUND" in cp.stderr and "j-999" in cp.stderr, cp.stderr
        # usage errors: exit 2 and a pointer to the help
        for args in ((), ("--format", "png", queued), ("--iteration", "-1", queued), ("--iteration", "x", queued),
                     (queued, "extra"), ("--bogus", queued)):
            cp = c.zbctl("trace", *args)
            assert cp.returncode == 2 and "zbctl trace --help" in cp.stderr, (args, cp.returncode, cp.stderr)
        cp = zbsvc.run_zbctl("trace", "--help")
        assert cp.returncode == 0 and "usage: zbctl trace JOB_ID" in cp.stdout and "--iteration" in cp.stdout
        c.assert_serving()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
