"""The README's default training job (deploy/jobs/local-train.yaml, passed
by ctest as ZB_DEFAULT_JOB) trains through the service: real zb-coordinator,
4 zb-workers and zbctl submit of the YAML itself.

- The spec is submitted twice, as written (zb-v) and with schedule 1f1b,
  same seed and data. The YAML must state model.layers: 8: left out, zb-v
  would derive 8 (2 stages per rank x 4 ranks) and 1f1b 4 (one stage per
  rank), a different model; stated, both train the same one.
- The loss falls well below its start: the mean of the last 10 iterations
  is below FALL = 0.6 x the first iteration's loss (from a fresh model the
  first loss is about ln(256) = 5.55; observed 5.5406 -> 2.2967 over 200
  iterations, and already 2.8414 after 40, so the bound 3.32 leaves room
  without admitting a model that does not learn).
- 1f1b and zb-v trace the same curve: per iteration |loss_zbv - loss_1f1b|
  <= CURVE_TOL x loss_1f1b. Each op is deterministic and every stage runs
  its W ops in microbatch order under both schedules, so the curves are
  bit for bit equal (0 observed); CURVE_TOL = 1e-6 is tighter than issue
  4's 1e-5 and leaves room only for fp32 summation order.
- Both builds run the full 200 iterations of both jobs: about 35 s in the
  dev build, about 4 minutes under ASan+UBSan (ZB_TEST_SANITIZE=1), where
  the element-wise kernels run several times slower.
"""

import os
import re
import shutil
import tempfile

import zbsvc
from zbsvc import STATE, Cluster, iteration_events

DEFAULT_JOB = os.environ["ZB_DEFAULT_JOB"]
LAYERS = 8
FALL = 0.6  # last-10 mean < FALL x first loss
CURVE_TOL = 1e-6


def variant(text, schedule):
    """The default job's YAML with its schedule replaced."""
    out, n = re.subn(r"(?m)^schedule:\s*\S+", "schedule: %s" % schedule, text)
    assert n == 1, "no schedule: line in %s" % DEFAULT_JOB
    return out


def test_default_job_trains():
    with open(DEFAULT_JOB) as f:
        text = f.read()
    iterations = int(re.search(r"(?m)^iterations:\s*(\d+)", text).group(1))
    ranks = int(re.search(r"(?m)^ranks:\s*(\d+)", text).group(1))
    assert re.search(r"(?m)^schedule:\s*zb-v\b", text) and iterations == 200 and ranks == 4, text
    assert re.search(r"(?m)^  layers:\s*%d\s*(#.*)?$" % LAYERS, text), "model.layers must be %d" % LAYERS
    tmp = tempfile.mkdtemp(prefix="zb-default-job-")
    try:
        with Cluster(workers=ranks, name="default-job") as c:
            curves = {}
            for schedule in ("zb-v", "1f1b"):
                path = os.path.join(tmp, "%s.yaml" % schedule)
                with open(path, "w") as f:
                    f.write(variant(text, schedule))
                cp = c.zbctl("submit", path)
                assert cp.returncode == 0, cp.stderr
                jid = cp.stdout.strip()
                job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=600)
                assert job.iterations_done == iterations, job
                its = iteration_events(c.events(jid))
                assert [it.iteration for it in its] == list(range(iterations)), [it.iteration for it in its]
                assert all(it.has_loss for it in its), [it.iteration for it in its if not it.has_loss]
                losses = [it.loss for it in its]
                first, tail = losses[0], sum(losses[-10:]) / 10
                print("%-5s %d iterations: loss %.4f -> %.4f (last-10 mean; bound %.4f)" %
                      (schedule, iterations, first, tail, FALL * first))
                assert 5.0 < first < 6.0, (schedule, first)
                assert tail < FALL * first, (schedule, losses)
                curves[schedule] = losses
                c.wait_workers(ranks)
            rel = max(abs(a - b) / abs(b) for a, b in zip(curves["zb-v"], curves["1f1b"]))
            print("zb-v vs 1f1b: max relative loss difference %.3g (tolerance %g)" % (rel, CURVE_TOL))
            assert rel <= CURVE_TOL, (curves["zb-v"], curves["1f1b"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
