"""1f1b, zb-h1 and zb-v jobs on 4 workers run to SUCCEEDED, and their
measured bubble ratios follow the plans: zb-v's is below 1f1b's on the
same shape and both are within 0.05 of the simulator's prediction. And
`zbctl plan compare` offline: a row per family, zb-auto's from its
search over every placement."""

import json

import zbsvc
from zbsvc import STATE, Cluster, iteration_events, job_spec

P, M, ITERATIONS = 4, 16, 5
T = 0.01  # one rank's share per op: 1f1b ops take 10-20 ms, zb-v's chunk ops 5 ms


def run_job(c, schedule):
    jid = c.submit(job_spec(name="sched-" + schedule, ranks=P, microbatches=M, schedule=schedule, t=T,
                            iterations=ITERATIONS, bytes_per_activation=4096))
    job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
    assert job.iterations_done == ITERATIONS, job
    assert job.schedule == schedule, job.schedule
    its = iteration_events(c.events(jid))
    assert [it.iteration for it in its] == list(range(ITERATIONS)), [it.iteration for it in its]
    for it in its:
        assert it.schedule == schedule, it
        assert sorted(r.rank for r in it.ranks) == list(range(P)), it
        assert it.wall_seconds > 0 and it.samples_per_second > 0, it
        assert 0 <= it.bubble_ratio < 1, it
    later = its[1:]  # the first iteration also pays for connecting
    measured = sum(it.bubble_ratio for it in later) / len(later)
    predicted = later[0].predicted_bubble_ratio
    print("%-6s measured bubble %.4f (iterations 1..%d: %s), predicted %.4f" %
          (schedule, measured, ITERATIONS - 1, " ".join("%.4f" % it.bubble_ratio for it in later), predicted))
    return measured, predicted


def test_schedules_run_and_bubbles_follow_the_plan():
    with Cluster(workers=P, name="schedules") as c:
        results = {s: run_job(c, s) for s in ("1f1b", "zb-h1", "zb-v")}
        for s, (measured, predicted) in results.items():
            assert abs(measured - predicted) < 0.05, "%s: measured %.4f vs predicted %.4f" % (s, measured,
                                                                                                 predicted)
        assert results["zb-v"][0] < results["1f1b"][0], results
        assert results["zb-v"][1] < results["zb-h1"][1] < results["1f1b"][1], results
        c.wait_workers(P)


def test_plan_compare_rows_every_family_and_auto_searches():
    """zb-auto's row searches every placement, as `zbctl plan --schedule
    zb-auto` does: at its limit (1F1B's peak, p units) its makespan is
    no higher than any family's that fits that limit, and it names its
    choice; the table says the same as the JSON."""
    for costs in ("1,1,1,0", "1,1.3,0.7,0.05"):
        args = ["plan", "compare", "--ranks", "8", "--microbatches", "32", "--costs", costs]
        cp = zbsvc.run_zbctl(*args, "-o", "json")
        assert cp.returncode == 0, cp.stderr
        out = json.loads(cp.stdout)
        rows = {r["schedule"]: r for r in out["families"]}
        assert set(rows) >= {"1f1b", "zb-h1", "zb-auto", "zb-v", "v-half", "v-min", "zb-interleaved",
                             "dualpipe-v"}, sorted(rows)
        assert all(r["error"] is None for r in rows.values()), out
        auto, limit = rows["zb-auto"], out["zb_auto_mem_limit"]
        assert limit == 8 and auto["peak_memory"] <= limit + 1e-9, auto
        assert auto["chose"] in rows and auto["chunks"] >= 1, auto
        fits = [r for r in rows.values() if r["peak_memory"] <= limit + 1e-9]
        assert len(fits) >= 5, fits  # 1f1b, zb-h1, zb-v, v-half, v-min at least
        for r in fits:
            assert auto["makespan"] <= r["makespan"] + 1e-9, (costs, auto, r)
        assert auto["makespan"] < rows["zb-h1"]["makespan"], (costs, auto)  # the loop-only search did not
        table = zbsvc.run_zbctl(*args)
        assert table.returncode == 0, table.stderr
        line = next(ln for ln in table.stdout.splitlines() if ln.startswith("zb-auto "))
        assert "(chose %s)" % auto["chose"] in line and line.split()[1] == str(auto["chunks"]), line


if __name__ == "__main__":
    zbsvc.run_tests(globals())
