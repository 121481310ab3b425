"""Process lifecycle: --help and --version exit 0, bad flags exit 2 with
a message, SIGTERM stops zb-coordinator (exit 0, also with workers, a
running job and a live watcher) and zb-worker (exit 0), a second
coordinator on a taken port fails to start, a worker holds its data port
for its whole life (no other process can take it between jobs) and one
started on a taken data port fails to start. A worker's CBLAS, as its
--version prints it, is what ListWorkers and `zbctl workers` show."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import zbsvc
from zbsvc import SLOW, STATE, Cluster, job_spec, zb_pb2


def run(argv, timeout=30):
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout * SLOW)
    assert not zbsvc.sanitizer_report(cp.stderr), cp.stderr
    return cp


def test_help_and_version():
    for binary, name in ((zbsvc.COORDINATOR, "zb-coordinator"), (zbsvc.WORKER, "zb-worker")):
        cp = run([binary, "--help"])
        assert cp.returncode == 0, (binary, cp.returncode, cp.stderr)
        assert cp.stdout.startswith("usage: " + name), cp.stdout
        cp = run([binary, "--version"])
        assert cp.returncode == 0 and cp.stdout.startswith(name + " "), (cp.returncode, cp.stdout)
    for sub in (["submit"], ["watch"], ["cancel"], ["update-schedule"], ["workers"], ["list"], ["get"]):
        cp = run([zbsvc.ZBCTL] + sub + ["--help"])
        assert cp.returncode == 0 and "usage: zbctl " + sub[0] in cp.stdout, (sub, cp.returncode, cp.stdout)


def test_bad_flags():
    with tempfile.TemporaryDirectory(prefix="zbsvc-flags-") as d:
        data = ["--data-dir", os.path.join(d, "data")]
        cases = [
            ([zbsvc.COORDINATOR, "--heartbeat-timeout-ms", "soon"] + data, "heartbeat_timeout_ms"),
            ([zbsvc.COORDINATOR, "--max-message-bytes", "12"] + data, "max_message_bytes"),
            ([zbsvc.COORDINATOR, "--log-level", "loud"] + data, "log_level"),
            ([zbsvc.COORDINATOR, "--bogus"] + data, "usage"),
            ([zbsvc.COORDINATOR, "extra"] + data, "extra"),
            ([zbsvc.WORKER, "--heartbeat-ms", "0"], "heartbeat-ms"),
            ([zbsvc.WORKER, "--log-level", "loud"], "log-level"),
            ([zbsvc.WORKER, "--bogus"], "usage"),
            ([zbsvc.WORKER, "--advertise-address", "a b"], "advertise-address"),
            ([zbsvc.WORKER, "--memory-bytes", "-1"], "memory-bytes"),
            ([zbsvc.COORDINATOR, "--retain-finished-jobs", "0"] + data,
             "retain_finished_jobs"),
        ]
        for argv, needle in cases:
            cp = run(argv)
            assert cp.returncode == 2, (argv, cp.returncode, cp.stderr)
            assert needle in cp.stderr, (argv, cp.stderr)
        assert not os.path.exists(os.path.join(d, "data", "zb.db"))


def test_unusable_data_dir():
    with tempfile.TemporaryDirectory(prefix="zbsvc-data-") as d:
        blocker = os.path.join(d, "file")
        with open(blocker, "w") as f:
            f.write("not a directory\n")
        cp = run([zbsvc.COORDINATOR, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir",
                  os.path.join(blocker, "data")])
        assert cp.returncode == 1 and "data_dir" in cp.stderr, (cp.returncode, cp.stderr)
        bad = os.path.join(d, "bad")
        os.mkdir(bad)
        with open(os.path.join(bad, "zb.db"), "wb") as f:
            f.write(b"this is not an SQLite database" * 100)
        cp = run([zbsvc.COORDINATOR, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir",
                  bad])
        assert cp.returncode == 1 and "zb.db" in cp.stderr, (cp.returncode, cp.stderr)


def test_sigterm_stops_the_coordinator_cleanly():
    with Cluster(workers=2, name="sigterm") as c:
        jid = c.submit(job_spec(ranks=2, microbatches=4, iterations=500))
        c.wait_iterations(jid, 1)
        watch = subprocess.Popen(zbsvc._WRAP + [zbsvc.ZBCTL, "watch", jid, "--coordinator", c.address],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        zbsvc.wait_until("zbctl watch to print", lambda: watch.stdout.readline(), 10)
        rc, clean = c.coordinator.stop()
        assert clean and rc == 0, "zb-coordinator exited %s on SIGTERM (clean %s)" % (rc, clean)
        _, err = watch.communicate(timeout=30 * SLOW)
        assert watch.returncode == 1, (watch.returncode, err)
        assert not zbsvc.sanitizer_report(err), err
        # workers outlive it, retrying, and stop on SIGTERM themselves
        for w in c.workers.values():
            assert w.alive(), w.name
            rc, clean = w.stop()
            assert clean and rc == 0, "%s exited %s on SIGTERM" % (w.name, rc)


def test_sigint_and_idle_sigterm():
    with Cluster(workers=0, name="sigint") as c:
        c.coordinator.signal(signal.SIGINT)
        assert c.coordinator.wait(15 * SLOW) == 0
        c.start_coordinator()
        c.assert_serving()
        rc, clean = c.coordinator.stop()
        assert clean and rc == 0, rc


def test_sighup_reloads_the_config_but_flags_still_win():
    cfg_dir = tempfile.mkdtemp(prefix="zbsvc-config-")
    cfg = os.path.join(cfg_dir, "zb.yaml")
    with open(cfg, "w") as f:
        f.write("heartbeat_timeout_ms: 60000\nlog_level: info\n")
    try:
        # the Cluster gives --heartbeat-timeout-ms 1500 as a flag, over the file's 60000
        with Cluster(workers=2, name="sighup", coordinator_args=["--config", cfg]) as c:
            with open(cfg, "w") as f:
                f.write("heartbeat_timeout_ms: 50000\nlog_level: debug\n")
            c.coordinator.signal(signal.SIGHUP)
            zbsvc.wait_until("the reload", lambda: "SIGHUP: reloaded" in c.coordinator.log_text(), 10)
            with open(cfg, "w") as f:
                f.write("heartbeat_timeout_ms: [not, a, number]\n")
            c.coordinator.signal(signal.SIGHUP)
            zbsvc.wait_until("the refusal", lambda: "keeping the running config" in c.coordinator.log_text(), 10)
            c.assert_serving()
            # the flag's timeout still holds: a frozen worker is found out in seconds, not in 50
            jid = c.submit(job_spec(ranks=2, microbatches=4, iterations=100000))
            c.wait_iterations(jid, 1)
            frozen = c.workers[c.worker_of_rank(jid, 0)]
            frozen.signal(signal.SIGSTOP)
            try:
                job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=10)
            finally:
                frozen.signal(signal.SIGCONT)
            assert "timeout 1500 ms" in job.reason, job.reason
    finally:
        shutil.rmtree(cfg_dir, ignore_errors=True)


def test_second_coordinator_on_a_taken_port_fails():
    with Cluster(workers=0, name="taken") as c:
        with tempfile.TemporaryDirectory(prefix="zbsvc-second-") as d:
            cp = run([zbsvc.COORDINATOR, "--listen", c.address, "--metrics-listen", "127.0.0.1:0", "--data-dir",
                      os.path.join(d, "data")])
            assert cp.returncode == 1 and "listen" in cp.stderr, (cp.returncode, cp.stderr)
            cp = run([zbsvc.COORDINATOR, "--listen", "127.0.0.1:0", "--metrics-listen",
                      "127.0.0.1:%d" % c.metrics_port, "--data-dir", os.path.join(d, "data2")])
            assert cp.returncode == 1 and "metrics_listen" in cp.stderr, (cp.returncode, cp.stderr)
        c.assert_serving()


def port_is_taken(address):
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            return True
    return False


def test_worker_holds_its_data_port_between_jobs():
    with Cluster(workers=2, name="dataport") as c:
        addrs = sorted(w.data_address for w in c.wait_workers(2))
        assert all(port_is_taken(a) for a in addrs), ("a data port is free while its worker is idle", addrs)
        for _ in range(2):  # two jobs on the same ports: the second reuses the listeners
            jid = c.submit(job_spec(ranks=2, microbatches=4, iterations=3))
            job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)
            assert job.state == STATE.JOB_STATE_SUCCEEDED, job
            ws = c.wait_workers(2)
            assert sorted(w.data_address for w in ws) == addrs, ws
            assert all(port_is_taken(a) for a in addrs), ("a data port was released after a job", addrs)
        # a third worker told to listen on a taken data port says so and exits
        cp = run([zbsvc.WORKER, "--coordinator", c.address, "--id", "w-taken", "--listen", addrs[0]])
        assert cp.returncode == 1 and "--listen" in cp.stderr and "in use" in cp.stderr, (cp.returncode, cp.stderr)
        c.assert_serving()


def test_worker_on_a_wildcard_address_advertises_one_peers_can_dial():
    """A worker listening on 0.0.0.0 advertises --advertise-address (a
    pod's IP in Kubernetes) with its bound port, else its host name, never
    0.0.0.0; a job across two such workers runs."""
    with Cluster(workers=0, name="advertise") as c:
        for k in range(2):
            c.start_worker("adv%d" % k, extra=["--listen", "0.0.0.0:0", "--advertise-address", "127.0.0.1"])
        c.start_worker("named", extra=["--listen", "0.0.0.0:0"])
        ws = {w.id: w.data_address for w in c.wait_workers(3)}
        print("advertised: %s" % ws)
        assert all(ws["adv%d" % k].startswith("127.0.0.1:") for k in range(2)), ws
        assert ws["named"].startswith(socket.gethostname() + ":") and "0.0.0.0" not in ws["named"], ws
        assert "advertising" in c.workers["named"].log_text()  # says why, and how to choose
        c.workers["named"].stop()
        jid = c.submit(job_spec(ranks=2, microbatches=4, iterations=2))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)
        c.assert_serving()


def test_job_waits_for_its_workers():
    """A job submitted before its workers attach waits PENDING, its reason
    counting them, and starts when they come; one whose workers do not come
    within its wait_for_workers_s fails saying so."""
    with Cluster(workers=0, name="pending") as c:
        jid = c.submit(job_spec(ranks=2, microbatches=4, iterations=2))
        job = c.get(jid)
        print("submitted with no worker: %s, %s" % (zbsvc.state_name(job.state), job.reason))
        assert job.state == STATE.JOB_STATE_PENDING and "waiting for 2 workers" in job.reason, job
        assert "0 attached" in job.reason, job.reason
        c.start_worker("late0")
        zbsvc.wait_until("the reason to count one", lambda: "1 attached" in c.get(jid).reason, 15)
        assert c.get(jid).state == STATE.JOB_STATE_PENDING
        c.start_worker("late1")
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)
        reasons = [e.reason for e in c.events(jid)]
        assert any("0 attached" in r for r in reasons) and any("1 attached" in r for r in reasons), reasons
        short = c.submit(job_spec(ranks=3, microbatches=4, iterations=2, wait_for_workers_s=2))
        job = c.wait_state(short, STATE.JOB_STATE_FAILED, timeout=30)
        print("after its wait: %s" % job.reason)
        assert "no 3 workers" in job.reason and "wait_for_workers_s 2" in job.reason and "2 attached" in job.reason
        after = c.submit(job_spec(ranks=2, microbatches=4, iterations=2))  # the queue moves on
        c.wait_state(after, STATE.JOB_STATE_SUCCEEDED)
        c.assert_serving()


def test_waiting_job_does_not_hold_the_queue():
    """A job still waiting for workers to attach holds nothing: a later job
    that fits the idle workers starts beside it (backfill). Once the big
    job's workers are attached it holds the ones behind it again, so it
    starts as soon as the running job ends."""
    with Cluster(workers=2, name="backfill") as c:
        big = c.submit(job_spec(name="big", ranks=4, microbatches=4, iterations=2, wait_for_workers_s=600))
        small = c.submit(job_spec(name="small", ranks=2, microbatches=4, iterations=2))
        c.wait_state(small, STATE.JOB_STATE_SUCCEEDED, timeout=30)
        assert c.get(big).state == STATE.JOB_STATE_PENDING, c.get(big)
        busy = c.submit(job_spec(name="busy", ranks=2, microbatches=4, iterations=100000))
        c.wait_state(busy, STATE.JOB_STATE_RUNNING)
        c.start_worker("w2")
        c.start_worker("w3")
        c.wait_workers(4, idle=False)
        later = c.submit(job_spec(name="later", ranks=2, microbatches=4, iterations=2))
        time.sleep(1)  # two idle workers: it would fit, but big has its workers now and is first
        assert c.get(later).state == STATE.JOB_STATE_PENDING, c.get(later)
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=busy), timeout=10)
        c.wait_state(big, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        c.wait_state(later, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        c.assert_serving()


def start_worker_on_host(c, wid, host):
    """A worker in a UTS namespace of its own whose host name is host."""
    argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, zbsvc.WORKER,
            "--coordinator", c.address, "--id", wid, "--heartbeat-ms", "200"]
    p = zbsvc.Proc("worker-" + wid, argv, c.dir)
    c.workers[wid] = p
    c.procs.append(p)
    return p


def test_ranks_keep_to_hosts():
    """Workers of two hosts attached alternately (a, b, a, b): a 4-rank
    job's ranks 0-1 share one host and 2-3 the other, not alternating,
    and the job and zbctl get show the map."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("SKIP: needs root and unshare to give workers host names of their own")
        return
    with Cluster(workers=0, name="hosts") as c:
        for k, host in enumerate(["host-a", "host-b", "host-a", "host-b"]):
            start_worker_on_host(c, "h%d" % k, host)
            c.wait_workers(k + 1)  # attach order a, b, a, b
        assert sorted(w.hostname for w in c.list_workers()) == ["host-a", "host-a", "host-b", "host-b"]
        jid = c.submit(job_spec(ranks=4, microbatches=8, iterations=2))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)
        hosts = list(c.get(jid).rank_hosts)
        print("rank hosts: %s" % hosts)
        assert hosts in (["host-a", "host-a", "host-b", "host-b"], ["host-b", "host-b", "host-a", "host-a"]), hosts
        out = c.zbctl("get", jid).stdout
        assert "ranks 0-1 on %s, 2-3 on %s" % (hosts[0], hosts[2]) in out, out
        c.assert_serving()


def test_workers_show_blas():
    """zb-worker --version names the CBLAS its cpu backend was built
    against (docs/model.md, BLAS; "none" without one); the worker
    advertises the same string on attach, and ListWorkers, `zbctl workers`
    (column BLAS, before the GPU) and its JSON output show it."""
    cp = run([zbsvc.WORKER, "--version"])
    lines = cp.stdout.splitlines()
    assert cp.returncode == 0 and len(lines) == 2 and lines[1].startswith("blas: "), cp.stdout
    blas = lines[1][len("blas: "):]
    assert blas == "none" or blas.split()[0] in ("openblas", "blis", "mkl"), blas
    print("zb-worker --version: %s" % blas)
    with Cluster(workers=2, name="blas") as c:
        ws = c.list_workers()
        assert sorted(w.id for w in ws) == ["w0", "w1"] and all(w.blas == blas for w in ws), ws
        cp = c.zbctl("workers")
        assert cp.returncode == 0, cp.stderr
        header = cp.stdout.splitlines()[0].split()
        assert header[-2:] == ["BLAS", "GPU"], header
        rows = [ln for ln in cp.stdout.splitlines()[1:] if ln.split()[0] in ("w0", "w1")]
        assert len(rows) == 2 and all(" %s " % blas in ln for ln in rows), cp.stdout
        js = c.zbctl("workers", "--output", "json")
        assert js.returncode == 0 and js.stdout.count('"%s"' % blas) == 2, js.stdout


if __name__ == "__main__":
    zbsvc.run_tests(globals())
