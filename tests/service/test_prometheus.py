"""zb's Prometheus assets against the real tools (issue 14, Metrics): the
scrape config and rules pass `promtool check`, the rules' unit tests pass
`promtool test rules`, and a real Prometheus (Debian's package) scraping a
coordinator every second while jobs run returns data for every recording
rule, every alert expression and every expression of the Grafana
dashboard, through its HTTP API. The scenario makes each alert's condition
true: a training job (tokens/s, loss), simulated jobs with a rank six
times slow (a straggler; without timelines, so that nothing is learned, a
bubble above the plan), a job that fails, a lost
worker, a stalled job (no progress; its 10-minute window shortened to 4 s,
the only change made to an expression) and, last, the coordinator down."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import zbsvc
from zbsvc import STATE, Cluster, job_spec, zb_pb2

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PROM = os.path.join(ROOT, "deploy", "prometheus")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "zb-dashboard.json")


def promtool(*args):
    cp = subprocess.run(["promtool"] + list(args), capture_output=True, text=True, cwd=PROM, timeout=120)
    assert cp.returncode == 0, "promtool %s:\n%s%s" % (" ".join(args), cp.stdout, cp.stderr)
    return cp.stdout


def test_promtool_checks_and_rule_unit_tests():
    if not shutil.which("promtool"):
        print("SKIP: promtool missing (package prometheus)")
        return
    promtool("check", "config", "prometheus.yml")
    promtool("check", "rules", "zb-rules.yml")
    out = promtool("test", "rules", "zb-rules.test.yml")
    print(out.strip().replace("\n", " "))


def rules():
    """(name, expr) of every recording rule and alert (each expr on one
    line, as zb-rules.yml keeps them; promtool has checked the file)."""
    with open(os.path.join(PROM, "zb-rules.yml")) as f:
        text = f.read()
    found = re.findall(r"-\s+(?:alert|record):\s*(\S+)\s*\n\s+expr:\s*(.+)", text)
    assert len(found) == text.count("expr:"), found
    return found


def dashboard_exprs():
    with open(DASHBOARD) as f:
        d = json.load(f)
    return [(p["title"], t["expr"]) for p in d["panels"] for t in p["targets"]]


class Prometheus:
    def __init__(self, d, metrics_port):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        config = os.path.join(d, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                    "rule_files: [%s]\n"
                    "scrape_configs:\n"
                    "  - job_name: zb-coordinator\n"
                    "    static_configs: [{targets: ['127.0.0.1:%d']}]\n" %
                    (os.path.join(PROM, "zb-rules.yml"), metrics_port))
        self.log = open(os.path.join(d, "prometheus.log"), "w")
        self.p = subprocess.Popen(["prometheus", "--config.file", config, "--storage.tsdb.path",
                                   os.path.join(d, "tsdb"), "--web.listen-address", "127.0.0.1:%d" % self.port,
                                   "--log.level", "warn"], stdout=self.log, stderr=subprocess.STDOUT)
        zbsvc.wait_until("Prometheus to scrape the coordinator",
                         lambda: self.query('up{job="zb-coordinator"} == 1'), 30)

    def query(self, expr):
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (self.port, urllib.parse.urlencode({"query": expr}))
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except OSError:
            return None
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def stop(self):
        self.p.terminate()
        self.p.wait(30)
        self.log.close()


def all_return_data(prom, named, what):
    """Waits until every expression returns a series; names those that do not."""
    missing = named
    end = time.monotonic() + 30 * zbsvc.SLOW
    while missing and time.monotonic() < end:
        missing = [(n, e) for n, e in missing if not prom.query(e)]
        time.sleep(0.5)
    assert not missing, "%s returning no data: %s" % (what, missing)
    print("%d %s return data" % (len(named), what))


def cpu_job():
    model = zb_pb2.ModelSpec(hidden=32, heads=2, layers=4, seq_len=32, batch=4, seed=7)
    return zb_pb2.JobSpec(name="train", ranks=2, microbatches=4, schedule="1f1b", iterations=1000000,
                          backend="cpu", model=model, trace_every=1)


def test_a_real_prometheus_gets_data_for_every_rule_and_panel():
    if not shutil.which("prometheus"):
        print("SKIP: prometheus missing (package prometheus)")
        return
    named = rules()
    alerts = dict(named)
    with tempfile.TemporaryDirectory(prefix="zb-prom-") as d, \
            Cluster(workers=0, name="prometheus", heartbeat_timeout_ms=60000) as c:
        prom = Prometheus(d, c.metrics_port)
        try:
            for k in range(2):
                c.start_worker("cpu%d" % k)
            c.wait_workers(2)
            train = c.submit(cpu_job())
            c.wait_iterations(train, 2, timeout=60)
            c.start_worker("sim0")
            c.start_worker("sim1", env={"ZB_TEST_SIM_SLOWDOWN": "6"})
            c.wait_workers(4, idle=False)
            slow = c.submit(job_spec(name="slow", ranks=2, microbatches=8, t=0.01, iterations=1000000,
                                     trace_every=1))
            c.wait_iterations(slow, 3, timeout=60)
            # the same slow rank without timelines: nothing is learned, so the
            # plan's prediction stays the spec's and the bubble is above it
            # (learned costs would predict the slow rank)
            c.start_worker("sim2")
            c.start_worker("sim3", env={"ZB_TEST_SIM_SLOWDOWN": "6"})
            c.wait_workers(6, idle=False)
            blind = c.submit(job_spec(name="blind", ranks=2, microbatches=8, t=0.01, iterations=1000000,
                                      trace_every=-1))
            c.wait_iterations(blind, 3, timeout=60)
            c.start_worker("f0")
            c.wait_workers(7, idle=False)
            bad = cpu_job()
            bad.ranks, bad.name, bad.model.data = 1, "bad", "/nonexistent/corpus.txt"
            c.wait_state(c.submit(bad), STATE.JOB_STATE_FAILED, timeout=60)
            spare = c.start_worker("spare")
            c.wait_workers(8, idle=False)
            spare.kill()
            all_return_data(prom, dashboard_exprs(), "dashboard panels")
            firing = [(n, e) for n, e in named if n in ("ZbWorkerLost", "ZbJobFailing", "ZbStraggler",
                                                        "ZbBubbleAbovePrediction") or n.startswith("zb:")]
            all_return_data(prom, firing, "recording rules and alerts")
            # a job that stops progressing: one of its ranks stopped
            c.workers["cpu1"].signal(signal.SIGSTOP)
            try:
                stalled = re.sub(r"\[10m\]", "[4s]", alerts["ZbNoProgress"])
                time.sleep(6)
                all_return_data(prom, [("ZbNoProgress", stalled)], "no-progress alerts")
            finally:
                c.workers["cpu1"].signal(signal.SIGCONT)
            c.coordinator.stop()
            all_return_data(prom, [("ZbCoordinatorDown", alerts["ZbCoordinatorDown"])], "coordinator-down alerts")
            c.start_coordinator(port=c.port)
        finally:
            prom.stop()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
