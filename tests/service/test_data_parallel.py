"""Data parallelism through the service (docs/formats.md, Data
parallelism): a sim job of data_parallel 2 x ranks 2 runs on four real
workers to completion, its per-rank metrics carry a replica label for
both replicas, zbctl get shows the replicas x stages grid, a lost worker
fails the job naming its replica and stage, rank_order places ranks on
hosts as documented, and bad specs get errors naming the key while the
coordinator keeps serving."""

import os
import shutil

import grpc

import zbsvc
from zbsvc import STATE, Cluster, job_spec, parse_metrics, rpc_error, series
from test_lifecycle import start_worker_on_host

HEARTBEAT_TIMEOUT_MS = 1500


def dp_spec(name, iterations, **kw):
    return job_spec(name=name, ranks=2, microbatches=4, schedule="1f1b", iterations=iterations, t=0.004,
                    data_parallel=2, **kw)


def test_sim_job_runs_on_two_replicas():
    with Cluster(workers=4, name="dp-run") as c:
        jid = c.submit(dp_spec("dp", 40))
        c.wait_iterations(jid, 2)
        assert list(c.get(jid).rank_states) == ["running"] * 4, c.get(jid)
        _, _, body = c.metrics()
        samples = parse_metrics(body)
        for rep in ("0", "1"):
            got = series(samples, "zb_rank_bubble_ratio", job_id=jid, replica=rep)
            assert len(got) == 2, (rep, got)  # both stages of each replica
        assert sorted(dict(lab)["rank"] for lab in series(samples, "zb_rank_bubble_ratio", job_id=jid)) == \
            ["0", "1", "2", "3"]
        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=90)
        assert job.iterations_done == 40 and len(job.rank_workers) == 4, job
        assert sorted(job.rank_workers) == ["w0", "w1", "w2", "w3"], job.rank_workers
        assert list(job.rank_states) == ["SUCCEEDED"] * 4, job.rank_states  # the job's, once it ended
        out = c.zbctl("get", jid).stdout
        assert "grid       2 replicas x 2 stages, rank_order pipelines" in out, out
        for rep in range(2):
            line = [ln for ln in out.splitlines() if ln.startswith("replica %-3d" % rep)]
            assert len(line) == 1 and "stage 0: " in line[0] and "stage 1: " in line[0], out
            assert line[0].count(" SUCCEEDED") == 2, line
        print(out)
        c.assert_serving()


def test_lost_worker_names_replica_and_stage():
    with Cluster(workers=4, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS, name="dp-loss") as c:
        jid = c.submit(dp_spec("dp-loss", 100000))
        c.wait_iterations(jid, 1)
        wid = c.worker_of_rank(jid, 3)  # global rank 3 = replica 1, stage 1
        c.workers[wid].kill()
        job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=30)
        assert job.reason.startswith("rank 3 (replica 1, stage 1, worker %s)" % wid), job.reason
        print(job.reason)
        c.assert_serving()


def test_rank_order_places_ranks_on_hosts():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("SKIP: needs root and unshare to give workers host names of their own")
        return
    with Cluster(workers=0, name="dp-hosts") as c:
        for k, host in enumerate(["host-a", "host-b", "host-a", "host-b"]):
            start_worker_on_host(c, "h%d" % k, host)
            c.wait_workers(k + 1)
        jid = c.submit(dp_spec("pipes", 2))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        hosts = list(c.get(jid).rank_hosts)
        # pipelines: a replica's two stages share a host
        assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2], hosts
        jid = c.submit(dp_spec("stages", 2, rank_order="stages"))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        hosts = list(c.get(jid).rank_hosts)
        # stages: a stage's two replicas (global ranks r and 2 + r) share one
        assert hosts[0] == hosts[2] and hosts[1] == hosts[3] and hosts[0] != hosts[1], hosts
        assert "rank_order stages" in c.zbctl("get", jid).stdout
        c.assert_serving()


def test_bad_specs_are_refused():
    with Cluster(workers=2, name="dp-bad") as c:
        bad = [(dp_spec("neg", 2, zero=2), grpc.StatusCode.INVALID_ARGUMENT, ["'zero'", "0 or 1"]),
               (dp_spec("zsim", 2, zero=1), grpc.StatusCode.INVALID_ARGUMENT, ["'zero'", "backend is 'sim'"]),
               (job_spec(name="d", ranks=2, data_parallel=-1), grpc.StatusCode.INVALID_ARGUMENT,
                ["'data_parallel'", "between 1 and"]),
               (job_spec(name="big", ranks=4, data_parallel=300), grpc.StatusCode.INVALID_ARGUMENT,
                ["data_parallel", "over the limit of 1024"]),
               (job_spec(name="order", ranks=2, rank_order="hosts"), grpc.StatusCode.INVALID_ARGUMENT,
                ["rank_order", "pipelines, stages"]),
               (dp_spec("cuda", 2, backend="cuda"), grpc.StatusCode.UNIMPLEMENTED,
                ["data_parallel > 1 with backend 'cuda'", "needs transport nccl", "'tcp'"]),
               # ZeRO-1 runs on cpu jobs (test_zero1); on cuda it is refused
               (dp_spec("zcuda", 2, backend="cuda", transport="nccl", zero=1), grpc.StatusCode.UNIMPLEMENTED,
                ["spec.zero", "ZeRO-1 on cuda not built yet"])]
        for spec, code, words in bad:
            got, details = rpc_error(c.submit, spec)
            assert got == code and all(w in details for w in words), (spec.name, got, details)
            print("%s: %s" % (spec.name, details))
        path = os.path.join(c.dir, "zero.yaml")
        with open(path, "w") as f:
            f.write("name: z\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\ndata_parallel: 0\n")
        cp = c.zbctl("submit", path)
        assert cp.returncode != 0 and "data_parallel" in cp.stderr and "line 5" in cp.stderr, cp.stderr
        c.assert_serving()
        assert c.list_jobs() == []
        ok = c.submit(job_spec(name="after", ranks=2, microbatches=4, iterations=2))
        c.wait_state(ok, STATE.JOB_STATE_SUCCEEDED, timeout=60)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
