"""/metrics passes `promtool check metrics`, and moves while a job runs:
zb_reports_total and zb_job_iterations_total{job_id} grow between scrapes,
zb_workers_attached counts the workers, zb_rank_bubble_ratio has one
series per rank of the running job; no series carries a label named
`job` (Prometheus's own); a finished job's series leave the text after
metrics_keep_ended_s, the totals keep it."""

import os
import socket
import subprocess
import tempfile
import urllib.request

import zbsvc
from zbsvc import Cluster, job_spec, parse_metrics, series


def promtool_check(body):
    cp = subprocess.run([zbsvc.PROMTOOL, "check", "metrics"], input=body, capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0, "promtool check metrics: exit %d\n%s%s\n--- body:\n%s" % (
        cp.returncode, cp.stdout, cp.stderr, body)


def no_job_label(samples):
    bad = [n for (n, labels) in samples if any(k == "job" for k, _ in labels)]
    assert not bad, "series with a label named job: %s" % bad[:5]


def scrape(c, check=True):
    """The parsed /metrics text; check: also through promtool (a process
    start: polls leave it out, so a loaded machine cannot eat their
    deadline, and the text they accept is checked once after)."""
    status, ctype, body = c.metrics()
    assert status == 200, status
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype, ctype
    assert body.endswith("\n")
    if check:
        promtool_check(body)
    samples = parse_metrics(body)
    no_job_label(samples)
    return samples


def poll(c):
    return scrape(c, check=False)


def one(samples, name, **labels):
    s = series(samples, name, **labels)
    assert len(s) == 1, "%s%s: %s" % (name, labels, s)
    return next(iter(s.values()))


def test_metrics_move_while_a_job_runs():
    with Cluster(workers=4, name="metrics", coordinator_args=["--metrics-keep-ended-s", "3"]) as c:
        # the text is rendered when scraped; the deadlines leave room for a
        # machine busy with other tests
        m0 = zbsvc.wait_until("zb_workers_attached 4",
                              lambda: (lambda m: m if one(m, "zb_workers_attached") == 4 else None)(poll(c)), 15)
        scrape(c)  # that text, through promtool
        assert one(m0, "zb_build_info") == 1
        assert all(v == 0 for v in series(m0, "zb_jobs").values()), series(m0, "zb_jobs")

        jid = c.submit(job_spec(name="scraped", schedule="zb-h1", iterations=400))
        c.wait_iterations(jid, 2)
        zbsvc.wait_until("the metrics text to show the job", lambda: series(poll(c), "zb_rank_bubble_ratio"), 15)
        m1 = scrape(c)
        it1 = c.get(jid).iterations_done
        c.wait_iterations(jid, it1 + 2)
        m2 = zbsvc.wait_until("a newer metrics text",
                              lambda: (lambda m: m if one(m, "zb_job_iterations_total", job_id=jid) >
                                       one(m1, "zb_job_iterations_total", job_id=jid) else None)(poll(c)), 15)
        assert one(m2, "zb_reports_total") > one(m1, "zb_reports_total")
        assert one(m2, "zb_job_iterations_total", job_id=jid) > one(m1, "zb_job_iterations_total", job_id=jid)
        assert one(m2, "zb_workers_attached") == 4
        assert one(m2, "zb_jobs", state="running") == 1
        for m in (m1, m2):
            bub = series(m, "zb_rank_bubble_ratio", job_id=jid)
            assert sorted(dict(lab)["rank"] for lab in bub) == ["0", "1", "2", "3"], bub
            assert all(0 <= v < 1 for v in bub.values()), bub
            mem = series(m, "zb_rank_peak_memory_bytes", job_id=jid)
            assert len(mem) == 4 and all(v > 0 for v in mem.values()), mem
            assert not series(m, "zb_rank_device_peak_bytes", job_id=jid)  # a sim job has no GPU
            assert one(m, "zb_job_microbatches_per_second", job_id=jid) > 0
            assert not series(m, "zb_job_samples_per_second")  # a sim job has no samples
            assert one(m, "zb_job_running", job_id=jid) == 1 and one(m, "zb_job_iteration_seconds", job_id=jid) > 0
            assert 0 <= one(m, "zb_job_bubble_ratio", job_id=jid) < 1
            assert 0 <= one(m, "zb_job_predicted_bubble_ratio", job_id=jid) < 1
            comm = series(m, "zb_rank_comm_wait_seconds", job_id=jid)
            assert len(comm) == 4 and all(v >= 0 for v in comm.values()), comm
        ops = series(m2, "zb_op_duration_seconds_count", job_id=jid)
        assert sorted(set((dict(lab)["rank"], dict(lab)["op"]) for lab in ops)) == \
            [(str(r), op) for r in range(4) for op in "BFW"], ops
        # each rank runs every microbatch's F, B and W once an iteration, so
        # a series counts 16 per sampled iteration its rank reported, and
        # its +Inf bucket is its count
        inf = {(dict(lab)["rank"], dict(lab)["op"]): v
               for lab, v in series(m2, "zb_op_duration_seconds_bucket", job_id=jid, le="+Inf").items()}
        for lab, n in ops.items():
            assert n > 0 and n % 16 == 0, ops
            assert inf[(dict(lab)["rank"], dict(lab)["op"])] == n, (inf, ops)
        assert one(m2, "zb_plan_seconds_count") >= 1

        c.stub.CancelJob(zbsvc.zb_pb2.CancelJobRequest(job_id=jid), timeout=10)
        c.wait_workers(4)
        m3 = zbsvc.wait_until("the metrics text to drop the job's ranks",
                              lambda: (lambda m: m if not series(m, "zb_rank_bubble_ratio") else None)(poll(c)),
                              15)
        scrape(c)
        assert one(m3, "zb_jobs", state="cancelled") == 1 and one(m3, "zb_jobs", state="running") == 0
        assert one(m3, "zb_job_iterations_total", job_id=jid) >= one(m2, "zb_job_iterations_total", job_id=jid)
        assert one(m3, "zb_job_running", job_id=jid) == 0
        assert one(m3, "zb_jobs_finished_total", state="cancelled") == 1
        # after metrics_keep_ended_s (3 s here) every series of the job goes
        m4 = zbsvc.wait_until("the finished job's series to leave",
                              lambda: (lambda m: m if not [n for (n, lab) in m if ("job_id", jid) in lab] else None)(
                                  poll(c)), 15)
        assert one(m4, "zb_jobs", state="cancelled") == 1  # the totals keep it
        lost = one(m4, "zb_workers_lost_total")

        # killing a worker shows at the next render
        c.workers["w3"].kill()
        zbsvc.wait_until("zb_workers_attached to drop to 3",
                         lambda: one(poll(c), "zb_workers_attached") == 3, 10)
        assert one(scrape(c), "zb_workers_lost_total") == lost + 1


def test_metrics_http_errors():
    with Cluster(workers=0, name="metrics-http") as c:
        status, _, body = c.metrics("/nope")
        assert status == 404 and "/metrics" in body, (status, body)
        scrape(c)


def test_metrics_listen_takes_ipv6_and_names():
    """metrics_listen takes "[IPv6]:port" and host names, not only IPv4;
    a name that does not resolve stops the start, naming it."""
    has_v6 = socket.has_ipv6 and os.path.exists("/proc/net/if_inet6")
    listen = "[::1]:0" if has_v6 else "localhost:0"
    with Cluster(workers=0, name="metrics-v6", coordinator_args=["--metrics-listen", listen]) as c:
        host = "[::1]" if has_v6 else "localhost"
        with urllib.request.urlopen("http://%s:%d/metrics" % (host, c.metrics_port), timeout=10) as r:
            body = r.read().decode()
        print("%s: %d bytes of metrics" % (listen, len(body)))
        assert r.status == 200 and "zb_build_info" in body
    with tempfile.TemporaryDirectory(prefix="zbsvc-mlisten-") as d:
        cp = subprocess.run([zbsvc.COORDINATOR, "--listen", "127.0.0.1:0", "--metrics-listen",
                             "no-such-host.invalid:0", "--data-dir", d], capture_output=True, text=True, timeout=60)
        assert cp.returncode != 0 and "no-such-host.invalid" in cp.stderr, (cp.returncode, cp.stderr)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
