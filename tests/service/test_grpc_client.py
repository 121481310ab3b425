"""An independent client, Python grpcio with stubs protoc generated from
proto/, talks to zb-coordinator: grpc.health.v1.Health/Check, SubmitJob,
GetJob, ListJobs, ListWorkers and Plan."""

import zbsvc
from zbsvc import STATE, Cluster, health_pb2, job_spec, rpc_error, zb_pb2

import grpc


def test_health_submit_list():
    with Cluster(workers=2, name="pyclient") as c:
        serving = health_pb2.HealthCheckResponse.SERVING
        assert c.health() == serving
        assert c.health("zb.v1.Zb") == serving
        code, details = rpc_error(c.health, "no.such.Service")
        assert code == grpc.StatusCode.NOT_FOUND and "no.such.Service" in details, (code, details)

        spec = job_spec(name="py-client", ranks=2, microbatches=6, schedule="zb-h1", iterations=2)
        resp = c.stub.SubmitJob(zb_pb2.SubmitJobRequest(spec=spec), timeout=10)
        jid = resp.job_id
        assert jid == "j-1", jid
        jobs = c.stub.ListJobs(zb_pb2.ListJobsRequest(), timeout=10).jobs
        assert [j.id for j in jobs] == [jid]
        assert jobs[0].spec.name == "py-client" and jobs[0].spec.ranks == 2 and jobs[0].spec.microbatches == 6
        assert jobs[0].state in (STATE.JOB_STATE_PENDING, STATE.JOB_STATE_RUNNING, STATE.JOB_STATE_SUCCEEDED)
        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)
        assert job.spec.schedule == "zb-h1" and job.spec.iterations == 2 and job.iterations_done == 2, job
        assert job.last.iteration == 1 and len(job.last.ranks) == 2, job.last
        assert job.created_unix_ms <= job.updated_unix_ms

        second = c.submit(job_spec(name="second", ranks=1, microbatches=2, iterations=1))
        assert [j.id for j in c.list_jobs()] == [jid, second]  # oldest first
        c.wait_state(second, STATE.JOB_STATE_SUCCEEDED)

        ws = c.stub.ListWorkers(zb_pb2.ListWorkersRequest(), timeout=10).workers
        assert sorted(w.id for w in ws) == ["w0", "w1"], ws
        for w in ws:
            # one entry each; cpu where zb-worker was built with OpenBLAS
            assert list(w.backends) in (["sim"], ["sim", "cpu"]) and list(w.transports) == ["tcp"], w
            assert w.data_address.startswith("127.0.0.1:") and w.last_seen_unix_ms > 0, w


def test_jobs_queue_in_order():
    with Cluster(workers=2, name="queue") as c:
        ids = [c.submit(job_spec(name="q%d" % k, ranks=2 - k % 2, microbatches=4, iterations=2)) for k in range(4)]
        for jid in ids:
            c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)
        # no job started before every earlier one had: FIFO, no overtaking
        started = []
        for jid in ids:
            ev = c.events(jid)
            started.append(next(e.unix_ms for e in ev if e.state == STATE.JOB_STATE_RUNNING))
        assert started == sorted(started), started
        c.wait_workers(2, idle=True)


def test_plan_rpc():
    with Cluster(workers=1, name="pyplan") as c:
        spec = job_spec(name="", ranks=4, microbatches=8, schedule="zb-v", iterations=0)
        plan = c.stub.Plan(zb_pb2.PlanRequest(spec=spec), timeout=30)
        assert plan.schedule == "zb-v" and plan.ranks == 4 and plan.chunks == 2 and plan.microbatches == 8
        assert [a.rank for a in plan.actions] == [0, 1, 2, 3]
        for a in plan.actions:
            computes = [x for x in a.actions if "SEND" not in x and "RECV" not in x]
            assert len(computes) == 3 * 8 * 2, (a.rank, computes)  # F, I and W of 8 microbatches, 2 chunks
        assert 0 <= plan.bubble_ratio < 0.2 and len(plan.peak_memory) == 4, plan
        code, details = rpc_error(c.stub.Plan, zb_pb2.PlanRequest(spec=spec, objective="fastest"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "objective" in details, (code, details)
        # zbctl plan --remote goes through the same RPC
        cp = c.zbctl("plan", "--remote", "--schedule", "zb-h1", "--ranks", "4", "--microbatches", "8")
        assert cp.returncode == 0 and "zb-h1" in cp.stdout and "rank 3:" in cp.stdout, (cp.stdout, cp.stderr)


def test_cli_conventions():
    """-o/--output is the format on every command (plan's and trace's files
    go to --output-file), and the service flags may come before the
    command."""
    with Cluster(workers=2, name="cli") as c:
        jid = c.submit(job_spec(ranks=2, microbatches=4, iterations=2))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)
        before = zbsvc.run_zbctl("-o", "json", "--coordinator", c.address, "list")
        after = zbsvc.run_zbctl("list", "-o", "json", "--coordinator", c.address)
        assert before.returncode == 0 and before.stdout == after.stdout and '"id": "' + jid in before.stdout, \
            (before.stdout, before.stderr)
        got = zbsvc.run_zbctl("--coordinator=" + c.address, "get", jid, "-o", "json")
        assert got.returncode == 0 and got.stdout.lstrip().startswith("{"), got.stderr
        plan = zbsvc.run_zbctl("plan", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "-o", "json")
        assert plan.returncode == 0 and plan.stdout.lstrip().startswith("{"), plan.stderr
        old = zbsvc.run_zbctl("plan", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2", "--output",
                              "plan.svg")
        assert old.returncode == 2 and "--output-file" in old.stderr, (old.returncode, old.stderr)
        bad = zbsvc.run_zbctl("--bogus", "list")
        assert bad.returncode == 2 and "--bogus" in bad.stderr, bad.stderr


if __name__ == "__main__":
    zbsvc.run_tests(globals())
