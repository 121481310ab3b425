"""zbctl watch streams a job's events: one iteration line per iteration,
in order, and exits 0 on SUCCEEDED (1 otherwise); --output json prints
one JSON event per line."""

import json
import os
import re
import subprocess

import zbsvc
from zbsvc import STATE, Cluster, job_yaml

ITERATIONS = 6


def submit_yaml(c, text):
    path = os.path.join(c.dir, "job-%d.yaml" % len(os.listdir(c.dir)))
    with open(path, "w") as f:
        f.write(text)
    cp = c.zbctl("submit", path)
    assert cp.returncode == 0, cp.stderr
    jid = cp.stdout.strip()
    assert re.fullmatch(r"j-\d+", jid), cp.stdout
    return jid


def check_text(out, jid):
    iters = [(int(a), int(b)) for a, b in re.findall(r"iter (\d+)/(\d+)", out)]
    assert iters == [(k, ITERATIONS) for k in range(1, ITERATIONS + 1)], "iteration lines of %s: %s\n%s" % (
        jid, iters, out)
    lines = [line for line in out.splitlines() if line.strip()]
    assert "SUCCEEDED" in lines[-1], "last line: %r" % lines[-1]
    assert sum("SUCCEEDED" in line for line in lines) == 1, out
    assert any("RUNNING" in line for line in lines), out


def check_json(out):
    events = [json.loads(line) for line in out.splitlines()]  # every line is one JSON document
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(events) + 1)), seqs
    its = [e["iteration"]["iteration"] for e in events if e.get("iteration")]
    assert its == list(range(ITERATIONS)), its
    assert events[-1]["state"] == "JOB_STATE_SUCCEEDED", events[-1]
    assert all(e["state"] != "JOB_STATE_SUCCEEDED" for e in events[:-1])
    for e in events:
        if e.get("iteration"):
            it = e["iteration"]
            assert it["schedule"] == "zb-h1", it
            assert len(it["ranks"]) == 4, it
            assert 0 <= it["bubble_ratio"] < 1, it


def test_watch_streams_every_iteration_live():
    with Cluster(workers=4, name="watch") as c:
        jid = submit_yaml(c, job_yaml(name="watched", schedule="zb-h1", iterations=ITERATIONS))
        # both watchers start while the job is pending or running and follow it live
        argv = [zbsvc.ZBCTL, "watch", jid, "--coordinator", c.address]
        text = subprocess.Popen(zbsvc._WRAP + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        js = subprocess.Popen(zbsvc._WRAP + argv + ["--output", "json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        out, err = text.communicate(timeout=60 * zbsvc.SLOW)
        assert text.returncode == 0, "watch exited %d: %s" % (text.returncode, err)
        assert not zbsvc.sanitizer_report(err), err
        check_text(out, jid)
        jout, jerr = js.communicate(timeout=60 * zbsvc.SLOW)
        assert js.returncode == 0, "watch --output json exited %d: %s" % (js.returncode, jerr)
        assert not zbsvc.sanitizer_report(jerr), jerr
        check_json(jout)
        assert c.get(jid).state == STATE.JOB_STATE_SUCCEEDED

        # a finished job replays the same history, then the stream ends
        cp = c.zbctl("watch", jid)
        assert cp.returncode == 0, cp.stderr
        check_text(cp.stdout, jid)
        cp = c.zbctl("watch", jid, "--output", "json")
        assert cp.returncode == 0, cp.stderr
        check_json(cp.stdout)
        assert cp.stdout == jout, "replayed JSON events differ from the live ones"


def test_watchers_that_leave_early_and_many_at_once():
    with Cluster(workers=2, name="watchers") as c:
        jid = c.submit(zbsvc.job_spec(name="crowd", ranks=2, microbatches=4, iterations=8))
        req = zbsvc.zb_pb2.WatchJobRequest(job_id=jid)
        leavers = [c.stub.WatchJob(req, timeout=60) for _ in range(8)]
        for k, st in enumerate(leavers):  # read a little, then hang up
            for _ in range(1 + k % 3):
                next(st)
            st.cancel()
        stayers = [c.stub.WatchJob(req, timeout=60 * zbsvc.SLOW) for _ in range(16)]
        histories = [[(e.seq, e.state, e.iteration.iteration if e.HasField("iteration") else -1) for e in st]
                     for st in stayers]
        assert all(h == histories[0] for h in histories), "watchers saw different histories"
        assert [i for _, _, i in histories[0] if i >= 0] == list(range(8)), histories[0]
        assert histories[0][-1][1] == STATE.JOB_STATE_SUCCEEDED
        c.assert_serving()


def test_watch_unknown_job_fails():
    with Cluster(workers=1, name="watch-unknown") as c:
        cp = c.zbctl("watch", "j-42")
        assert cp.returncode == 1, (cp.returncode, cp.stdout, cp.stderr)
        assert "NOT_FOUND" in cp.stderr and "j-42" in cp.stderr, cp.stderr
        c.assert_serving()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
