"""Admission before work and planning off the loop (issue 13, Admission):
a job too large to plan is refused from its shape alone, before any
planning, with the coordinator's memory unchanged; a large plan is made
on libuv's thread pool while the loop keeps answering health checks; a
client that leaves while its job is planned leaves nothing behind.
Watchers (issue 28): what the coordinator holds for them is bounded in
bytes, per stream and in all; one cut for falling behind is told the
after_seq to resume with; one identity may hold max_streams_per_identity
streams."""

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

import zbsvc
from zbsvc import STATE, Cluster, health_pb2, job_spec, rpc_error, zb_pb2

import grpc


def rss_kb(pid, field="VmRSS"):
    """The process's resident memory (VmHWM: its peak so far), in kB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


@contextlib.contextmanager
def coordinator_config(text):
    """The coordinator flags that load a config file holding text."""
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(text)
    f.close()
    try:
        yield ["--config", f.name]
    finally:
        os.unlink(f.name)


# streams from the test's host: the stalled-watcher tests hold hundreds
MANY_STREAMS = "max_streams_per_identity: 1000\n"


def test_oversized_submits_are_refused_before_planning():
    with Cluster(workers=2, name="limits-oom") as c:
        pid = c.coordinator.pid
        before = rss_kb(pid)
        cases = [  # the threat model's shapes: more ranks than workers, and a plan past the budget
            (job_spec(name="huge", ranks=64, microbatches=500000, schedule="1f1b", wait_for_workers_s=-1),
             grpc.StatusCode.FAILED_PRECONDITION, "64 ranks but 2 workers"),
            (job_spec(name="huge", ranks=2, microbatches=1000000, schedule="zb-auto"),
             grpc.StatusCode.RESOURCE_EXHAUSTED, "max_plan_ops"),
            (job_spec(name="huge", ranks=2, microbatches=1000000, schedule="1f1b"),
             grpc.StatusCode.RESOURCE_EXHAUSTED, "max_message_bytes"),
        ]
        for spec, code, text in cases:
            t0 = time.monotonic()
            got, details = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(spec=spec), timeout=30)
            took = time.monotonic() - t0
            print("refused in %5.1f ms: %s %s" % (1e3 * took, got.name, details[:110]))
            assert got == code and text in details, (got, details)
        # the Plan RPC (zbctl plan --remote) takes the same budget
        got, details = rpc_error(c.stub.Plan, zb_pb2.PlanRequest(
            spec=job_spec(ranks=64, microbatches=1000000, schedule="zb-v")), timeout=30)
        assert got == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_plan_ops" in details, (got, details)
        after = rss_kb(pid)
        print("coordinator RSS %d kB -> %d kB" % (before, after))
        assert after - before < 8 * 1024, (before, after)  # nothing planned: a few kB of calls at most
        assert c.list_jobs() == []
        c.assert_serving()


def test_waiting_jobs_per_identity_are_capped():
    """One caller cannot fill the coordinator with waiting jobs: past
    max_pending_per_identity its submits are refused (RESOURCE_EXHAUSTED,
    naming the key) before any planning; cancelling one makes room."""
    import os
    import tempfile
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    cfg.write("max_pending_per_identity: 3\n")
    cfg.close()
    try:
        with Cluster(workers=1, name="limits-queue", coordinator_args=["--config", cfg.name]) as c:
            waiting = job_spec(ranks=4, microbatches=4, iterations=1, wait_for_workers_s=600)
            ids = [c.submit(waiting) for _ in range(3)]
            code, details = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(spec=waiting), timeout=10)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
            assert "max_pending_per_identity" in details and "3 jobs waiting" in details, details
            assert len(c.list_jobs()) == 3
            c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=ids[0]), timeout=10)
            c.wait_state(ids[0], STATE.JOB_STATE_CANCELLED)
            ids.append(c.submit(waiting))  # room again
            assert c.get(ids[-1]).state == STATE.JOB_STATE_PENDING
            c.assert_serving()
    finally:
        os.unlink(cfg.name)


def test_health_is_answered_while_a_large_plan_is_made():
    """Health checks sent while SubmitJob plans a large job complete before
    the submission does: the plan is made off the loop. Planning on the
    loop would hold every one of them until the plan was done."""
    with Cluster(workers=2, name="limits-loop") as c:
        spec = job_spec(name="large", ranks=2, microbatches=250000, schedule="zb-h1", t=0.0001, iterations=1)
        result = {}

        def submit():
            t0 = time.monotonic()
            result["id"] = c.submit(spec)
            result["took"] = time.monotonic() - t0
            result["done_at"] = time.monotonic()

        th = threading.Thread(target=submit)
        th.start()
        answered = []
        while th.is_alive():
            t0 = time.monotonic()
            assert c.health() == health_pb2.HealthCheckResponse.SERVING
            t1 = time.monotonic()
            answered.append((t1, t1 - t0))
            time.sleep(0.01)
        th.join()
        during = [lat for at, lat in answered if at < result["done_at"]]
        print("submission took %.2f s; %d health checks answered meanwhile, slowest %.1f ms" %
              (result["took"], len(during), 1e3 * max(during or [0])))
        assert len(during) >= 3, (result, answered)
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=result["id"], reason="measured"), timeout=30)
        # its large assignments delivered and released before the teardown (a
        # coordinator stopped with megabytes in flight to exiting workers has
        # been seen to take over 10 s to drain; not fixed yet)
        c.wait_workers(2, idle=True, timeout=60)
        c.assert_serving()


def test_health_is_answered_while_the_plan_rpc_plans():
    """The same for the Plan RPC (zbctl plan --remote), which plans too."""
    with Cluster(workers=0, name="limits-plan-rpc", max_message_bytes=64 << 20) as c:
        req = zb_pb2.PlanRequest(spec=job_spec(ranks=2, microbatches=250000, schedule="zb-h1"))
        result = {}
        # the answer lists every action (29 MB): a channel that takes it
        big = grpc.insecure_channel("127.0.0.1:%d" % c.port, options=[("grpc.max_receive_message_length", 64 << 20)])

        def plan():
            t0 = time.monotonic()
            result["resp"] = zbsvc.zb_pb2_grpc.ZbStub(big).Plan(req, timeout=120 * zbsvc.SLOW)
            result["done_at"] = time.monotonic()
            result["took"] = result["done_at"] - t0

        th = threading.Thread(target=plan)
        th.start()
        answered = []
        while th.is_alive():
            t0 = time.monotonic()
            assert c.health() == health_pb2.HealthCheckResponse.SERVING
            answered.append((time.monotonic(), time.monotonic() - t0))
            time.sleep(0.01)
        th.join()
        during = [lat for at, lat in answered if at < result["done_at"]]
        print("Plan took %.2f s; %d health checks answered meanwhile, slowest %.1f ms" %
              (result["took"], len(during), 1e3 * max(during or [0])))
        assert result["resp"].microbatches == 250000 and result["resp"].makespan > 0
        assert len(during) >= 3, (result["took"], answered)
        big.close()
        c.assert_serving()


def test_client_leaving_during_planning_leaves_no_job():
    with Cluster(workers=2, name="limits-leave") as c:
        spec = job_spec(name="abandoned", ranks=2, microbatches=400000, schedule="zb-h1", t=0.0001, iterations=1)
        code, _ = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(spec=spec), timeout=0.05)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED, code
        time.sleep(3 * zbsvc.SLOW)  # the plan finishes and is dropped
        assert c.list_jobs() == [], c.list_jobs()
        jid = c.submit(job_spec(name="next", ranks=2, microbatches=4, iterations=2))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)
        c.assert_serving()


def test_a_paused_coordinator_fails_no_job():
    """The coordinator stopped for 7 s, longer than the workers' 5 s report
    deadline and the 1.5 s heartbeat timeout: the ranks retry their reports
    and the job succeeds with every iteration counted once."""
    with Cluster(workers=2, name="limits-pause") as c:
        jid = c.submit(job_spec(name="paused", ranks=2, microbatches=4, t=0.005, iterations=40))
        c.wait_iterations(jid, 3)
        c.coordinator.signal(zbsvc.signal.SIGSTOP)
        time.sleep(7)
        c.coordinator.signal(zbsvc.signal.SIGCONT)
        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
        its = [it.iteration for it in zbsvc.iteration_events(c.events(jid))]
        assert its == list(range(40)), its
        print("paused 7 s: job %s %s, %d iterations, each once" % (jid, zbsvc.state_name(job.state), len(its)))
        c.assert_serving()


STALLED_WATCHERS = '''
import os, signal, sys, time
sys.path.insert(0, os.environ["ZB_PY_STUBS"])
import grpc
from zb.v1 import zb_pb2, zb_pb2_grpc
addr, jid, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
# 50 streams a connection: the coordinator lets one connection hold 100
local = [("grpc.use_local_subchannel_pool", 1)]
stubs = [zb_pb2_grpc.ZbStub(grpc.insecure_channel(addr, options=local)) for _ in range((n + 49) // 50)]
streams = [stubs[k // 50].WatchJob(zb_pb2.WatchJobRequest(job_id=jid), timeout=600) for k in range(n)]
for s in streams:
    next(s)  # each is open and delivering
print("open", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
'''


def test_watchers_hold_bounded_memory_and_miss_nothing():
    """200 watchers that never read hold a bounded queue each (the rest of
    the history stays in the store); a slow reader still gets every event
    in order; after_seq resumes a stream where it was."""
    # a total of 32 MiB: 200 stalled watchers of small events fill it (each
    # may hold 4 MiB), and the furthest behind are cut to make room
    with coordinator_config(MANY_STREAMS + "max_watch_bytes_total: 33554432\n") as conf, \
            Cluster(workers=2, name="limits-watch", coordinator_args=conf) as c:
        jid = c.submit(job_spec(name="chatty", ranks=2, microbatches=2, t=0.00005, iterations=3000))
        c.wait_iterations(jid, 5)
        pid = c.coordinator.pid
        before = rss_kb(pid)
        # 200 streams from a process that then stops: nothing reads them, its
        # socket fills, and every event after that waits at the coordinator
        stalled = subprocess.Popen([sys.executable, "-c", STALLED_WATCHERS, c.address, jid, "200"],
                                   stdout=subprocess.PIPE, text=True)
        assert stalled.stdout.readline().strip() == "open", "the stalled watchers did not start"
        slow, seqs = c.stub.WatchJob(zb_pb2.WatchJobRequest(job_id=jid), timeout=300), []
        for ev in slow:  # reads slowly while the job runs on
            seqs.append(ev.seq)
            if len(seqs) % 100 == 0:
                time.sleep(0.05)
        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
        peak = rss_kb(pid)
        print("job of %d events; coordinator RSS %d kB -> %d kB with 200 stalled watchers" %
              (len(seqs), before, peak))
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= job.iterations_done, seqs[-5:]
        # unbounded, every event is queued 200 times (194 MB here); under ASan
        # the RSS holds its quarantine of freed memory too, so only the order
        # is checked there (the 32 MiB total, plus 32 MiB of slack)
        assert zbsvc.SANITIZE or peak - before < 64 * 1024, (before, peak)
        tail = list(c.stub.WatchJob(zb_pb2.WatchJobRequest(job_id=jid, after_seq=len(seqs) - 3), timeout=30))
        assert [e.seq for e in tail] == [len(seqs) - 2, len(seqs) - 1, len(seqs)], [e.seq for e in tail]
        stalled.kill()
        stalled.wait()
        code, _ = rpc_error(lambda: list(c.stub.WatchJob(zb_pb2.WatchJobRequest(job_id=jid, after_seq=-1),
                                                          timeout=10)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, code
        c.assert_serving()


def test_one_connection_holds_at_most_100_calls():
    """A client connection may have 100 calls open at once (HTTP/2's
    MAX_CONCURRENT_STREAMS): its 101st waits on its own side until one of
    its calls ends, while other connections are served as before."""
    with coordinator_config(MANY_STREAMS) as conf, \
            Cluster(workers=1, name="limits-streams", coordinator_args=conf) as c:
        jid = c.submit(job_spec(ranks=1, microbatches=2, iterations=100000))
        c.wait_iterations(jid, 1)
        local = [("grpc.use_local_subchannel_pool", 1)]
        ch = grpc.insecure_channel(c.address, options=local)
        try:
            stub = zbsvc.zb_pb2_grpc.ZbStub(ch)
            streams = [stub.WatchJob(zb_pb2.WatchJobRequest(job_id=jid), timeout=120) for _ in range(100)]
            for s in streams:
                next(s)  # all 100 open and delivering
            code, _ = rpc_error(stub.GetJob, zb_pb2.GetJobRequest(job_id=jid), timeout=3)
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED, code  # the 101st waited
            assert c.get(jid).state == STATE.JOB_STATE_RUNNING  # another connection is served
            streams[0].cancel()
            assert stub.GetJob(zb_pb2.GetJobRequest(job_id=jid), timeout=10).id == jid  # room again
            for s in streams[1:]:
                s.cancel()
        finally:
            ch.close()
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10)
        c.assert_serving()


# Opens n WatchJob streams of a job (50 a connection), reads the first
# event of each (after_seq argv[4]), says "open" and stops itself; once
# continued, reads every stream to its end and prints one JSON line each:
# the seqs it got, and how the stream ended.
STALLED_THEN_READ = """
import json, os, signal, sys
sys.path.insert(0, os.environ["ZB_PY_STUBS"])
import grpc
from zb.v1 import zb_pb2, zb_pb2_grpc
addr, jid, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
local = [("grpc.use_local_subchannel_pool", 1)]
stubs = [zb_pb2_grpc.ZbStub(grpc.insecure_channel(addr, options=local)) for _ in range((n + 49) // 50)]
streams = [stubs[k // 50].WatchJob(zb_pb2.WatchJobRequest(job_id=jid), timeout=900) for k in range(n)]
got = [[] for _ in streams]
ends = [None] * n
for k, s in enumerate(streams):
    try:
        got[k].append(next(s).seq)
    except grpc.RpcError as e:  # cut before it was read: the rest of its story below
        ends[k] = (e.code().name, e.details())
print("open", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
for k, s in enumerate(streams):
    if ends[k] is None:
        try:
            for ev in s:
                got[k].append(ev.seq)
            ends[k] = ("OK", "")
        except grpc.RpcError as e:
            ends[k] = (e.code().name, e.details())
    print(json.dumps({"seqs": got[k], "code": ends[k][0], "details": ends[k][1]}), flush=True)
"""


def watch_metrics(c):
    """(streams open, bytes queued for watchers, streams cut) from /metrics."""
    m = zbsvc.parse_metrics(c.metrics()[2])
    one = lambda name: sum(zbsvc.series(m, name).values())
    return one("zb_watch_streams"), one("zb_watch_queued_bytes"), one("zb_watch_streams_cut_total")


def start_stalled(c, jid, n):
    p = subprocess.Popen([sys.executable, "-c", STALLED_THEN_READ, c.address, jid, str(n)],
                         stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([p.stdout], [], [], 180 * zbsvc.SLOW)  # never wait for ever
    if not ready:
        p.kill()
        p.wait()
    assert ready and p.stdout.readline().strip() == "open", "the stalled watchers did not start"
    return p


def read_stalled(p):
    """Continues the stalled process; each stream's {seqs, code, details}."""
    os.kill(p.pid, signal.SIGCONT)
    out, _ = p.communicate(timeout=300 * zbsvc.SLOW)
    assert p.returncode == 0, p.returncode
    return [json.loads(line) for line in out.splitlines()]


def check_cut_streams(streams, first_seq=1):
    """Every stream got its events in order with no gap; one cut names the
    last seq it got as its after_seq. Returns the cut ones."""
    cut = []
    for k, st in enumerate(streams):
        seqs = st["seqs"]
        assert seqs == list(range(first_seq, first_seq + len(seqs))), (k, seqs[:5], seqs[-5:])
        if st["code"] == "OK":
            continue
        assert st["code"] == "RESOURCE_EXHAUSTED", (k, st["code"], st["details"])
        resume = int(re.search(r"after_seq=(\d+)", st["details"]).group(1))
        assert resume == (seqs[-1] if seqs else first_seq - 1), (k, resume, seqs[-3:], st["details"])
        cut.append(st)
    return cut


BIG_EVENTS = dict(ranks=2, microbatches=4096, t=0.000001, trace_every=1)  # each event ~215 KB of timelines
WATCH_BUDGET, WATCH_TOTAL = 1 << 20, 256 << 20  # per stream: 1 MiB (the default is 4); the default total
# A stalled watcher falls 4 MiB (the default) behind in ~19 events, but the
# kernel ends a connection that has shown a zero window for 20 s (gRPC sets
# the server's TCP_USER_TIMEOUT to its 20 s keepalive timeout): its streams
# end UNAVAILABLE, uncut. On a busy machine (ASan, or CI running tests side
# by side) an iteration can take 1-2 s, so the last watchers were not cut
# in time: a budget of 1 MiB cuts every watcher within ~5 events. The total
# stays the default: it must hold the cut streams' messages in flight, 400
# x 215 KB.


def test_stalled_watchers_of_large_events_are_cut_and_resume():
    """400 watchers that stop reading a job whose every event carries its
    timelines (~215 KB): each is cut once it falls its budget behind, or
    to make room in the total, told after_seq = the last event it got;
    the coordinator's memory grows by less than the total budget and it
    serves on; a cut stream resumed from its after_seq gets the rest with
    no gap. Unbounded, 200 of them took 2.7 GB and 400 were OOM-killed."""
    budgets = "max_watch_bytes_per_stream: %d\nmax_watch_bytes_total: %d\n" % (WATCH_BUDGET, WATCH_TOTAL)
    with coordinator_config(MANY_STREAMS + budgets) as conf, \
            Cluster(workers=0, name="limits-big-watch", coordinator_args=conf) as c:
        # PENDING until its workers come: the watchers are all live from its first event
        jid = c.submit(job_spec(name="big", iterations=1000000, wait_for_workers_s=600, **BIG_EVENTS))
        pid = c.coordinator.pid
        before = rss_kb(pid)
        stalled = start_stalled(c, jid, 400)
        for k in range(2):
            c.start_worker("w%d" % k)
        c.wait_iterations(jid, 1)
        size = c.get(jid).last.ByteSize()

        def all_cut():
            streams, _, cuts = watch_metrics(c)
            # an uncut stream ends only when its connection does (see WATCH_BUDGET)
            assert streams + cuts >= 400, "%d streams ended uncut (%d open, %d cut)" % (400 - streams - cuts,
                                                                                       streams, cuts)
            return cuts >= 400

        zbsvc.wait_until("all 400 stalled watchers cut", all_cut, 300)
        peak = rss_kb(pid, "VmHWM")
        streams, queued, cuts = watch_metrics(c)
        print("events of %d bytes; 400 stalled watchers cut (%d); coordinator RSS %d kB -> peak %d kB "
              "(+%d kB; total budget %d kB); %d bytes still queued on %d streams" %
              (size, cuts, before, peak, peak - before, WATCH_TOTAL >> 10, queued, streams))
        assert size > 150000, size  # the event size this test is about
        assert queued <= WATCH_TOTAL, queued
        # the total budget, plus 64 MiB for gRPC's own per-stream and
        # per-connection state, SQLite's cache and the allocator's slack;
        # under ASan the RSS holds its quarantine too: only behaviour counts
        assert zbsvc.SANITIZE or peak - before < (WATCH_TOTAL >> 10) + 64 * 1024, (before, peak)
        c.assert_serving()
        got = read_stalled(stalled)
        assert len(got) == 400
        cut = check_cut_streams(got)
        behind = sum("fell behind by" in st["details"] for st in cut)
        print("%d cut: %d past their own budget, %d to make room in the total; e.g. %s" %
              (len(cut), behind, len(cut) - behind, cut[0]["details"]))
        assert len(cut) == 400, [st["code"] for st in got if st not in cut][:5]
        # resumed from where it was cut, one gets the rest, the job's end included
        resume = cut[0]["seqs"][-1]
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid, reason="measured"), timeout=30)
        c.wait_state(jid, STATE.JOB_STATE_CANCELLED)
        rest = list(c.stub.WatchJob(zb_pb2.WatchJobRequest(job_id=jid, after_seq=resume), timeout=120 * zbsvc.SLOW))
        assert [e.seq for e in rest] == list(range(resume + 1, resume + 1 + len(rest))), [e.seq for e in rest][:5]
        assert len(rest) > 1 and rest[-1].state == STATE.JOB_STATE_CANCELLED, (resume, len(rest))
        c.assert_serving()


def test_stalled_replays_hold_at_most_the_total():
    """Watchers that stop reading while the stored events are replayed to
    them: each page is bounded by the watcher's budget, not by a count of
    events (32 of ~215 KB would be 7 MB), and past the total the watcher
    furthest behind is cut to make room. The coordinator grows by less
    than the total; every stream, cut or not, got its events in order."""
    conf_text = MANY_STREAMS + "max_watch_bytes_per_stream: 2097152\nmax_watch_bytes_total: 67108864\n"
    with coordinator_config(conf_text) as conf, \
            Cluster(workers=2, name="limits-replay", coordinator_args=conf) as c:
        jid = c.submit(job_spec(name="history", iterations=40, **BIG_EVENTS))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=300)
        n_events = 43  # submitted, running, 40 iterations, succeeded: all replayed from the store
        pid = c.coordinator.pid
        before = rss_kb(pid)
        stalled = start_stalled(c, jid, 200)
        zbsvc.wait_until("stalled watchers cut to make room", lambda: watch_metrics(c)[2] >= 1, 120)
        peak = rss_kb(pid, "VmHWM")
        streams, queued, cuts = watch_metrics(c)
        print("200 stalled replays of %d events: %d cut; coordinator RSS %d kB -> peak %d kB (+%d kB; total "
              "budget %d kB); %d bytes queued on %d streams" %
              (n_events, cuts, before, peak, peak - before, 65536, queued, streams))
        assert queued <= 64 << 20, queued
        # unbounded pages: 200 x 32 events x 215 KB, 1.4 GB
        assert zbsvc.SANITIZE or peak - before < 65536 + 64 * 1024, (before, peak)
        c.assert_serving()
        got = read_stalled(stalled)
        cut = check_cut_streams(got)
        done = [st for st in got if st["code"] == "OK"]
        print("%d streams read to the end, %d cut (e.g. %s)" % (len(done), len(cut), cut[0]["details"] if cut else "-"))
        assert cut and all(len(st["seqs"]) == n_events for st in done), [len(st["seqs"]) for st in done][:5]
        resume = cut[0]["seqs"][-1] if cut[0]["seqs"] else 0
        rest = list(c.stub.WatchJob(zb_pb2.WatchJobRequest(job_id=jid, after_seq=resume), timeout=120 * zbsvc.SLOW))
        assert [e.seq for e in rest] == list(range(resume + 1, n_events + 1)), (resume, [e.seq for e in rest][:5])


def start_zbctl_watch(c, jid):
    """`zbctl watch JID --output json`, its stdout and stderr to files in
    the cluster's directory: (process, stdout path, stderr path)."""
    out_path, err_path = os.path.join(c.dir, "watch.out"), os.path.join(c.dir, "watch.err")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen([zbsvc.ZBCTL, "watch", jid, "--output", "json", "--coordinator", c.address],
                             stdout=out, stderr=err)
    return p, out_path, err_path


def lines(path):
    return open(path).read().splitlines()


def test_zbctl_watch_resumes_after_a_cut():
    """zbctl watch, stopped long enough to be cut, takes up after the last
    event it printed: every event once, in order; it says so on stderr once."""
    with coordinator_config("max_watch_bytes_per_stream: 1048576\n") as conf, \
            Cluster(workers=2, name="limits-zbctl", coordinator_args=conf) as c:
        jid = c.submit(job_spec(name="watched", iterations=1000000, **BIG_EVENTS))
        c.wait_iterations(jid, 1)
        zbctl, out_path, err_path = start_zbctl_watch(c, jid)
        try:
            zbsvc.wait_until("zbctl watch to print", lambda: len(lines(out_path)) >= 2, 60)
            zbctl.send_signal(signal.SIGSTOP)
            zbsvc.wait_until("zbctl's stream cut", lambda: watch_metrics(c)[2] >= 1, 120)
            zbctl.send_signal(signal.SIGCONT)
            zbsvc.wait_until("zbctl to resume", lambda: "resuming after event" in open(err_path).read(), 60)
            printed = len(lines(out_path))
            zbsvc.wait_until("events after the resumption", lambda: len(lines(out_path)) >= printed + 3, 60)
            c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=30)
            rc = zbctl.wait(timeout=120 * zbsvc.SLOW)
        finally:
            if zbctl.poll() is None:
                zbctl.kill()
                zbctl.wait()
        events = [json.loads(line) for line in lines(out_path)]
        seqs = [int(e["seq"]) for e in events]
        notes = [line for line in lines(err_path) if "resuming" in line]
        print("zbctl watch: %d events, exit %d; stderr: %s" % (len(seqs), rc, notes[0][:160]))
        assert seqs == list(range(1, len(seqs) + 1)), seqs
        assert events[-1]["state"] == "JOB_STATE_CANCELLED" and rc == 1, (events[-1]["state"], rc)
        assert len(notes) == 1 and "after_seq=" in notes[0], open(err_path).read()
        assert not zbsvc.sanitizer_report(open(err_path).read())


def test_zbctl_watch_resumes_after_its_connection_drops():
    """zbctl watch across a coordinator killed (SIGKILL) and started again
    on the same port: its stream ends UNAVAILABLE; it says the connection
    dropped, tries again each second and takes up after the last event it
    printed once the coordinator is back: every event once, in order."""
    with Cluster(workers=2, name="limits-drop") as c:
        jid = c.submit(job_spec(name="watched", ranks=2, iterations=1000000, t=0.005))
        c.wait_iterations(jid, 1)
        zbctl, out_path, err_path = start_zbctl_watch(c, jid)
        try:
            zbsvc.wait_until("zbctl watch to print", lambda: len(lines(out_path)) >= 2, 60)
            port = int(c.address.rsplit(":", 1)[1])
            c.coordinator.kill()
            zbsvc.wait_until("zbctl to see the drop", lambda: "connection dropped" in open(err_path).read(), 60)
            printed = len(lines(out_path))
            c.start_coordinator(port=port)
            zbsvc.wait_until("events after the restart", lambda: len(lines(out_path)) >= printed + 3, 120)
            c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=30)
            rc = zbctl.wait(timeout=120 * zbsvc.SLOW)
        finally:
            if zbctl.poll() is None:
                zbctl.kill()
                zbctl.wait()
        seqs = [int(json.loads(line)["seq"]) for line in lines(out_path)]
        notes = [line for line in lines(err_path) if "resuming" in line]
        print("zbctl watch: %d events, exit %d; stderr: %s" % (len(seqs), rc, notes[0][:160]))
        assert seqs == list(range(1, len(seqs) + 1)), seqs
        assert rc == 1 and len(notes) == 1, (rc, open(err_path).read())
        assert not zbsvc.sanitizer_report(open(err_path).read())


def test_streams_per_identity_are_capped():
    """Past max_streams_per_identity a certificate's next WatchJob is
    refused (RESOURCE_EXHAUSTED naming the key); another identity is served,
    and ending one of the first's streams makes room."""
    with coordinator_config("max_streams_per_identity: 3\n") as conf, \
            Cluster(workers=0, tls=True, name="limits-identity", coordinator_args=conf) as c:
        waiting = job_spec(ranks=1, microbatches=2, iterations=1, wait_for_workers_s=600)
        alice_job = c.submit(waiting)
        watch = lambda stub, jid: stub.WatchJob(zb_pb2.WatchJobRequest(job_id=jid), timeout=60)
        streams = [watch(c.stub, alice_job) for _ in range(3)]
        for s in streams:
            next(s)  # open and delivering
        code, details = rpc_error(lambda: next(watch(c.stub, alice_job)))
        print("4th stream of alice: %s %s" % (code.name, details))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert "max_streams_per_identity" in details and "user/alice has 3" in details, details
        ch, bob = c.stub_as("user-bob")
        try:
            bob_job = bob.SubmitJob(zb_pb2.SubmitJobRequest(spec=waiting), timeout=30).job_id
            bs = watch(bob, bob_job)
            assert next(bs).seq == 1  # another identity is served
            bs.cancel()
        finally:
            ch.close()
        streams[0].cancel()

        def room():  # the cancelled stream is counted until the server has let it go
            try:
                return next(watch(c.stub, alice_job)).seq == 1
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                return False

        zbsvc.wait_until("room for alice's stream again", room, 30)
        for s in streams[1:]:
            s.cancel()
        c.assert_serving()


def test_streams_per_client_host_in_insecure_mode():
    """In insecure mode every caller is the same anonymous admin, so the
    limit holds per client host: the 4th stream from 127.0.0.1 is refused."""
    with coordinator_config("max_streams_per_identity: 3\n") as conf, \
            Cluster(workers=0, name="limits-host", coordinator_args=conf) as c:
        jid = c.submit(job_spec(ranks=1, microbatches=2, iterations=1, wait_for_workers_s=600))
        streams = [c.stub.WatchJob(zb_pb2.WatchJobRequest(job_id=jid), timeout=60) for _ in range(3)]
        for s in streams:
            next(s)
        code, details = rpc_error(lambda: next(c.stub.WatchJob(zb_pb2.WatchJobRequest(job_id=jid), timeout=30)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert "ipv4:127.0.0.1 has 3" in details and "client host (insecure mode)" in details, details
        assert c.get(jid).state == STATE.JOB_STATE_PENDING  # unary calls are not streams
        for s in streams:
            s.cancel()
        c.assert_serving()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
