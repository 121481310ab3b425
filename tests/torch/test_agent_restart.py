"""zb.torch.attach across coordinator restarts (docs/pytorch.md, Attaching
a torchrun job): examples/torch_agent/train.py under torchrun with 2 gloo
processes runs a torch job while its coordinator is killed (SIGKILL) and
later drained (SIGTERM), each time started again on the same port and data
dir. The agents keep training through each outage, attach again naming
their running rank, and resend the reports the outage held back; the job
ends SUCCEEDED with every iteration reported once, in order, taken back
after the restart, and each stage's weights equal a non-pipelined run of
the same batches (float64, |diff| <= 1e-9). Without re-attach the job
fails: its ranks do not come back within the recovery window.

Borrows test_agent_torch.py's helpers (and so needs what it needs)."""

import json
import os
import time

import test_agent_torch as base  # exits 77 where torch or the service build is missing

import torch  # noqa: E402

zbsvc = base.zbsvc
P = 2
ITERATIONS = 60  # with --pause-s 0.1 about 8 s of training: room for two outages mid-run


def outage(c, jid, after, how):
    """Once `after` iterations are reported, ends the coordinator (SIGKILL
    or a drain), leaves it down a second (the ranks train on, their
    reports failing) and starts it again on its port and data dir."""
    c.wait_iterations(jid, after, timeout=120)
    port = c.port
    if how == "kill":
        c.coordinator.kill()
    else:
        rc, clean = c.coordinator.stop()
        assert clean and rc == 0, rc
    time.sleep(1)
    c.start_coordinator(port=port)
    assert c.port == port
    done = c.get(jid).iterations_done
    assert done < ITERATIONS, "the job ended before the %s's coordinator came back (%d done)" % (how, done)


def main():
    ex = base.load_example()
    run = "run-restart"
    with zbsvc.Cluster(workers=0, tls=True, name="torch-agent-restart") as c:
        c.make_certs(workers=["trun"])
        jid, out, proc, log = base.start_torchrun(c, P, run, iterations=ITERATIONS, pause_s=0.1)
        try:
            outage(c, jid, 5, "kill")
            outage(c, jid, c.get(jid).iterations_done + 3, "drain")
        finally:
            rc, text = base.finish(proc, log, 120)
        assert rc == 0, "torchrun exited %s:\n%s" % (rc, text[-4000:])
        job = c.wait_state(jid, zbsvc.STATE.JOB_STATE_SUCCEEDED, timeout=30)
        ev = c.events(jid)
        its = [it.iteration for it in zbsvc.iteration_events(ev)]
        assert its == list(range(ITERATIONS)), its  # every iteration once, in order
        assert sum("taken back after a coordinator restart" in e.reason for e in ev) >= 2, [e.reason for e in ev]
        assert list(job.rank_workers) == ["trun/%d" % r for r in range(P)], list(job.rank_workers)
        for r in range(P):
            with open(os.path.join(out, "rank%d.json" % r)) as f:
                got = json.load(f)
            assert len(got["plan_versions"]) == ITERATIONS and not got["cancelled"], (r, got)

        ref = base.reference(ex, P, ITERATIONS)
        worst = 0.0
        for s in range(P):
            got = torch.load(os.path.join(out, "stage%d.pt" % s))
            for name, want_t in ref[s].state_dict().items():
                worst = max(worst, (got[name] - want_t).abs().max().item())
        assert worst <= base.TOLERANCE, "stage weights differ from the non-pipelined run by %g" % worst
    print("two coordinator restarts: SUCCEEDED, %d iterations, weights within %.3g of the reference" %
          (ITERATIONS, worst))
    print("ok")


if __name__ == "__main__":
    main()
