"""1f1b, zb-h1 and zb-v jobs on 4 workers run to SUCCEEDED, and their
measured bubble ratios follow the plans: zb-v's is below 1f1b's on the
same shape and both are within 0.05 of the simulator's prediction."""

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


if __name__ == "__main__":
    zbsvc.run_tests(globals())
