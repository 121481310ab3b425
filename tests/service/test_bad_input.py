"""Bad input gets a clear error naming what is wrong, and the daemon keeps
serving (Health is checked after each): YAML through zbctl submit, bad
specs through SubmitJob and Plan, plans over the message limit, garbage on
the gRPC and metrics ports, Reports that do not fit, payloads that are
not protobuf, methods that do not exist."""

import json
import os
import random
import socket
import time

import zbsvc
from zbsvc import SLOW, STATE, Cluster, job_spec, rpc_error, zb_pb2

import grpc

INVALID = grpc.StatusCode.INVALID_ARGUMENT
LIMIT = 65536


def expect(c, code, needles, fn, *args, **kw):
    got, details = rpc_error(fn, *args, timeout=30 * SLOW, **kw)
    assert got == code, "%s: %s (%s), expected %s" % (getattr(fn, "_method", fn), got, details, code)
    for n in needles:
        assert n in details, "%r not in %r" % (n, details)
    c.assert_serving()
    return details


def submit_text(c, text):
    path = os.path.join(c.dir, "bad.yaml")
    with open(path, "w") as f:
        f.write(text)
    cp = c.zbctl("submit", path)
    c.assert_serving()
    return cp


def test_bad_yaml_through_zbctl():
    with Cluster(workers=1, name="bad-yaml") as c:
        good = "name: ok\nranks: 1\nmicrobatches: 2\nschedule: 1f1b\niterations: 1\n"
        cases = [
            ("name: x\nranks: [4\nmicrobatches: 8\n", ["line"]),  # malformed: an unclosed flow sequence
            ("name: x\nranks: 4\n  microbatches: 8\n", ["line"]),  # malformed: bad indentation
            ("name: t\nranks: four\nmicrobatches: 8\nschedule: 1f1b\n", ["ranks", "line 2", "four"]),
            ("name: t\nranks: 1\nmicrobatches: [8]\nschedule: 1f1b\n", ["microbatches", "line 3"]),
            ("name: t\nranks: 1\nmicrobatches: 2\nschedule: 1f1b\ncolour: red\n", ["colour", "line 5"]),
            ("name: t\nranks: 1\nmicrobatches: 2\nschedule: 1f1b\ncosts:\n  f: fast\n", ["costs.f", "line 6"]),
            ("name: t\nranks: 1\nmicrobatches: 2\nschedule: 1f1b\ncosts:\n  f: -0.5\n", ["costs.f", "line 6"]),
            ("name: t\nranks: 1\nmicrobatches: 2\nschedule: zb-nope\n", ["schedule", "line 4", "zb-nope"]),
            ("name: t\nmicrobatches: 2\nschedule: 1f1b\n", ["ranks"]),
            ("- just\n- a list\n", ["line 1"]),
            ("", []),
        ]
        for text, needles in cases:
            cp = submit_text(c, text)
            assert cp.returncode == 1, "exit %d for %r: %s%s" % (cp.returncode, text, cp.stdout, cp.stderr)
            assert cp.stdout == "", cp.stdout
            assert cp.stderr.startswith("zbctl submit: "), cp.stderr
            for n in needles:
                assert n in cp.stderr, "%r not in %r (for %r)" % (n, cp.stderr, text)
        cp = c.zbctl("submit", os.path.join(c.dir, "missing.yaml"))
        assert cp.returncode == 1 and "missing.yaml" in cp.stderr, cp.stderr
        assert c.list_jobs() == []  # none of it reached the coordinator's jobs
        cp = submit_text(c, good)
        assert cp.returncode == 0, cp.stderr
        c.wait_state(cp.stdout.strip(), STATE.JOB_STATE_SUCCEEDED)


def test_bad_specs_over_grpc():
    with Cluster(workers=2, max_message_bytes=LIMIT, name="bad-spec") as c:
        s = c.stub
        expect(c, INVALID, ["spec"], s.SubmitJob, zb_pb2.SubmitJobRequest())
        expect(c, INVALID, ["schedule", "zb-zz"], s.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=job_spec(ranks=2, schedule="zb-zz")))
        expect(c, grpc.StatusCode.FAILED_PRECONDITION, ["ranks", "8", "2 workers"], s.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=job_spec(ranks=8, wait_for_workers_s=-1)))
        expect(c, INVALID, ["costs.f"], s.SubmitJob, zb_pb2.SubmitJobRequest(spec=job_spec(ranks=2, t_f=-0.01)))
        expect(c, INVALID, ["costs.b"], s.SubmitJob, zb_pb2.SubmitJobRequest(spec=job_spec(ranks=2, t_b=-1)))
        expect(c, INVALID, ["costs.comm"], s.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=job_spec(ranks=2, t_comm=-0.001)))
        expect(c, INVALID, ["costs.f"], s.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=job_spec(ranks=2, t_f=float("nan"))))
        bad_stage = job_spec(ranks=2, microbatches=4)
        bad_stage.stage_costs.add(t_f=0.01, t_b=0.01, t_w=0.01)
        bad_stage.stage_costs.add(t_f=0.01, t_b=-0.01, t_w=0.01)
        expect(c, INVALID, ["stage_costs[1]"], s.SubmitJob, zb_pb2.SubmitJobRequest(spec=bad_stage))
        expect(c, INVALID, ["ranks"], s.SubmitJob, zb_pb2.SubmitJobRequest(spec=job_spec(ranks=0)))
        expect(c, INVALID, ["microbatches"], s.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=job_spec(ranks=2, microbatches=-3)))
        expect(c, INVALID, ["name"], s.SubmitJob, zb_pb2.SubmitJobRequest(spec=job_spec(name="", ranks=2)))
        expect(c, INVALID, ["name"], s.SubmitJob, zb_pb2.SubmitJobRequest(spec=job_spec(name="x" * 500, ranks=2)))
        expect(c, INVALID, ["backend"], s.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=job_spec(ranks=2, backend="abacus")))
        expect(c, INVALID, ["iterations"], s.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=job_spec(ranks=2, iterations=-1)))
        # a backend no attached worker offers is refused, not run on another one
        expect(c, grpc.StatusCode.FAILED_PRECONDITION,
               ["spec.backend", "backend cuda needs 2 workers with a GPU", "0 of the"], s.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=job_spec(ranks=2, backend="cuda", wait_for_workers_s=-1)))
        expect(c, INVALID, ["chunks"], s.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=job_spec(ranks=2, schedule="zb-v", chunks=3)))
        expect(c, INVALID, ["costs.f"], s.Plan, zb_pb2.PlanRequest(spec=job_spec(ranks=4, t_f=-2)))
        expect(c, INVALID, ["schedule"], s.Plan, zb_pb2.PlanRequest(spec=job_spec(ranks=4, schedule="")))
        expect(c, INVALID, ["spec"], s.Plan, zb_pb2.PlanRequest())
        expect(c, grpc.StatusCode.NOT_FOUND, ["job_id", "j-77"], s.GetJob, zb_pb2.GetJobRequest(job_id="j-77"))
        expect(c, INVALID, ["job_id"], s.GetJob, zb_pb2.GetJobRequest())
        expect(c, grpc.StatusCode.NOT_FOUND, ["job_id"], s.CancelJob, zb_pb2.CancelJobRequest(job_id="j-77"))
        expect(c, grpc.StatusCode.NOT_FOUND, ["job_id"], s.UpdateSchedule,
               zb_pb2.UpdateScheduleRequest(job_id="j-77", schedule="zb-v"))
        ev = expect(c, grpc.StatusCode.NOT_FOUND, ["job_id"], lambda *a, **k: list(s.WatchJob(*a, **k)),
                    zb_pb2.WatchJobRequest(job_id="j-77"))
        assert "j-77" in ev
        assert c.list_jobs() == []
        jid = c.submit(job_spec(ranks=2, microbatches=4, iterations=2))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)


def test_plans_over_the_message_limit():
    with Cluster(workers=4, max_message_bytes=LIMIT, name="too-big") as c:
        big = job_spec(name="huge", ranks=4, microbatches=3000, schedule="1f1b")
        d = expect(c, grpc.StatusCode.RESOURCE_EXHAUSTED, [str(LIMIT), "max_message_bytes"], c.stub.SubmitJob,
                   zb_pb2.SubmitJobRequest(spec=big))
        print("SubmitJob:", d)
        d = expect(c, grpc.StatusCode.RESOURCE_EXHAUSTED, [str(LIMIT), "max_message_bytes"], c.stub.Plan,
                   zb_pb2.PlanRequest(spec=big))
        print("Plan:", d)
        cp = c.zbctl("plan", "--remote", "--schedule", "1f1b", "--ranks", "4", "--microbatches", "3000")
        assert cp.returncode == 1 and "RESOURCE_EXHAUSTED" in cp.stderr and str(LIMIT) in cp.stderr, cp.stderr
        # a request over the limit is refused by the transport, which says so
        fat = job_spec(name="fat", ranks=4, microbatches=16)
        for _ in range(LIMIT // 8):
            fat.stage_costs.add(t_f=0.5, t_b=0.5, t_w=0.5)
        expect(c, grpc.StatusCode.RESOURCE_EXHAUSTED, [str(LIMIT)], c.stub.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=fat))
        assert c.list_jobs() == []
        # the same shape with fewer microbatches fits
        jid = c.submit(job_spec(name="fits", ranks=4, microbatches=16, iterations=1))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)


def test_huge_shapes_are_refused_without_stalling_running_jobs():
    # at the default limit (16 MiB): planning these would hold the
    # coordinator's loop for seconds (or exhaust its memory), and the
    # running job's workers would look dead
    with Cluster(workers=2, name="huge") as c:
        jid = c.submit(job_spec(name="bystander", ranks=2, microbatches=4, iterations=500))
        c.wait_iterations(jid, 1)
        for ranks, mb, sched in ((64, 30000, "1f1b"), (1024, 1000000, "zb-h1"), (16, 200000, "zb-v")):
            spec = job_spec(name="huge", ranks=ranks, microbatches=mb, schedule=sched)
            # the planning budget (max_plan_ops) or the message limit, whichever
            # the shape meets first: both are 16777216 by default
            expect(c, grpc.StatusCode.RESOURCE_EXHAUSTED, ["max_", "16777216"], c.stub.Plan,
                   zb_pb2.PlanRequest(spec=spec))
        expect(c, grpc.StatusCode.RESOURCE_EXHAUSTED, ["max_message_bytes", "16777216"], c.stub.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=job_spec(name="huge", ranks=2, microbatches=1000000)))
        done = c.get(jid).iterations_done
        c.wait_iterations(jid, done + 2)
        assert c.get(jid).state == STATE.JOB_STATE_RUNNING
        assert [j.id for j in c.list_jobs()] == [jid]
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10)


def raw_exchange(port, payload, read_s=1.0):
    """Connects, sends payload, reads until the peer closes or read_s passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sk:
        if payload:
            try:
                sk.sendall(payload)
            except OSError:
                pass
        sk.settimeout(read_s)
        got = b""
        deadline = time.monotonic() + read_s
        while time.monotonic() < deadline:
            try:
                chunk = sk.recv(65536)
            except socket.timeout:
                break
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        return got


def test_garbage_on_the_ports():
    rnd = random.Random(4242)
    with Cluster(workers=1, name="garbage") as c:
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        grpc_payloads = [
            bytes(rnd.getrandbits(8) for _ in range(4096)),
            b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
            b"POST /zb.v1.Zb/SubmitJob HTTP/1.1\r\nHost: x\r\nContent-Type: application/grpc\r\n"
            b"Content-Length: 5\r\n\r\n\x00\x00\x00\x00\x00",
            preface + bytes(rnd.getrandbits(8) for _ in range(2048)),
            preface + b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x7f\xff\xff\xff",  # a WINDOW_UPDATE before SETTINGS
            preface[:10],
            b"",
        ]
        for payload in grpc_payloads:
            raw_exchange(c.port, payload, read_s=0.5)
            c.assert_serving()
        http1 = raw_exchange(c.port, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", read_s=0.5)
        print("HTTP/1 to the gRPC port got %d bytes: %r" % (len(http1), http1[:80]))
        # a client that connects and says nothing does not block others
        idle = socket.create_connection(("127.0.0.1", c.port), timeout=5)
        try:
            c.assert_serving()
        finally:
            idle.close()

        metrics_payloads = [
            bytes(rnd.getrandbits(8) for _ in range(4096)),
            b"BLAH\r\n\r\n",
            b"GET\r\n\r\n",
            b"GET /metrics HTTP/9.9\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 100000 + b"\r\n\r\n",
            b"DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\n",  # never finishes its headers
            b"",
        ]
        for payload in metrics_payloads:
            got = raw_exchange(c.metrics_port, payload, read_s=0.5)
            if payload.startswith(b"DELETE"):
                assert got.startswith(b"HTTP/1.1 405"), got[:80]
            c.assert_serving()
            status, _, body = c.metrics()
            assert status == 200 and "zb_workers_attached" in body, status
        jid = c.submit(job_spec(ranks=1, microbatches=2, iterations=1))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)


def test_reports_that_do_not_fit():
    with Cluster(workers=2, name="bad-report") as c:
        s = c.stub
        expect(c, grpc.StatusCode.NOT_FOUND, ["job_id", "j-404"], s.Report,
               zb_pb2.ReportRequest(worker_id="w0", job_id="j-404", rank=0, iteration=0,
                                    metrics=zb_pb2.RankIteration(rank=0, wall_seconds=1)))
        # a worker not attached (yet) is told to try again: after a coordinator
        # restart its reports come before it has attached again
        expect(c, grpc.StatusCode.UNAVAILABLE, ["worker_id", "ghost", "attached"], s.Report,
               zb_pb2.ReportRequest(worker_id="ghost", job_id="j-1"))
        expect(c, INVALID, ["worker_id"], s.Report, zb_pb2.ReportRequest())
        jid = c.submit(job_spec(ranks=2, microbatches=4, iterations=500))
        c.wait_iterations(jid, 1)
        w0 = c.worker_of_rank(jid, 0)
        expect(c, INVALID, ["rank", "3"], s.Report,
               zb_pb2.ReportRequest(worker_id=w0, job_id=jid, rank=3, iteration=0,
                                    metrics=zb_pb2.RankIteration(rank=3, wall_seconds=1)))
        expect(c, INVALID, ["rank"], s.Report,
               zb_pb2.ReportRequest(worker_id=w0, job_id=jid, rank=1, error="not mine"))
        expect(c, INVALID, ["iteration"], s.Report,
               zb_pb2.ReportRequest(worker_id=w0, job_id=jid, rank=0, iteration=100000,
                                    metrics=zb_pb2.RankIteration(rank=0, wall_seconds=1)))
        expect(c, INVALID, ["iteration"], s.Report,
               zb_pb2.ReportRequest(worker_id=w0, job_id=jid, rank=0, iteration=-1,
                                    metrics=zb_pb2.RankIteration(rank=0, wall_seconds=1)))
        # a loss from a job that trains no model (an iteration no rank has reached)
        ahead = c.get(jid).iterations_done + 4
        expect(c, INVALID, ["metrics.has_loss", "no model"], s.Report,
               zb_pb2.ReportRequest(worker_id=w0, job_id=jid, rank=0, iteration=ahead,
                                    metrics=zb_pb2.RankIteration(rank=0, wall_seconds=1, loss=2.5, has_loss=True)))
        # timelines and clocks a rank of this plan could not have measured
        # (an iteration no rank has reached; each refused before it is kept)
        F = zb_pb2.ACTION_KIND_F

        def timeline(stage, mb, rows=1):
            return zb_pb2.OpTimeline(kind=[F] * rows, stage=[stage] * rows, microbatch=[mb] * rows,
                                     start_us=[0] * rows, duration_us=[5] * rows, group_size=[0] * rows)

        bad_times = [
            (["timeline row 0", "microbatch 2147483647"], dict(timeline=timeline(0, 2147483647))),
            (["timeline row 0", "stage 1"], dict(timeline=timeline(1, 0))),  # rank 1's stage
            (["timeline", "more than rank 0's"], dict(timeline=timeline(0, 0, rows=10000))),
            (["timeline", "columns"], dict(timeline=zb_pb2.OpTimeline(kind=[F], stage=[0, 0]))),
            (["clock_offset_seconds"], dict(clock_offset_seconds=float("nan"))),
            (["clock_offset_seconds"], dict(clock_offset_seconds=1e17)),
            (["start_monotonic_seconds"], dict(start_monotonic_seconds=float("inf"))),
            # figures that would be averaged and exported as they are
            (["comm_wait_seconds", "nan"], dict(comm_wait_seconds=float("nan"))),
            (["busy_b_seconds", "-1"], dict(busy_b_seconds=-1)),
            (["peak_memory", "inf"], dict(peak_memory=float("inf"))),
            (["bubble_ratio", "ratio"], dict(bubble_ratio=1.5)),
            (["bytes_sent"], dict(bytes_sent=-5)),
            (["device_peak_bytes", "-1 is negative"], dict(device_peak_bytes=-1)),
            (["device_used_bytes", "-7 is negative"], dict(device_peak_bytes=3, device_used_bytes=-7)),
        ]
        for needles, fields in bad_times:
            expect(c, INVALID, ["metrics."] + needles, s.Report,
                   zb_pb2.ReportRequest(worker_id=w0, job_id=jid, rank=0, iteration=ahead,
                                        metrics=zb_pb2.RankIteration(rank=0, wall_seconds=1, **fields)))
        expect(c, INVALID, ["worker_id"], lambda *a, **k: list(s.Attach(*a, **k)), zb_pb2.AttachRequest())
        expect(c, INVALID, ["data_address"], lambda *a, **k: list(s.Attach(*a, **k)),
               zb_pb2.AttachRequest(worker_id="intruder", data_address="nowhere"))
        # none of it disturbed the job
        assert c.get(jid).state == STATE.JOB_STATE_RUNNING
        c.wait_iterations(jid, c.get(jid).iterations_done + 1)
        s.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10)
        c.wait_workers(2)


def field(num, payload):
    """One length-delimited protobuf field, for strings Python will not build."""
    assert len(payload) < 128
    return bytes([num << 3 | 2, len(payload)]) + payload


def test_text_that_is_not_utf8():
    # proto3 strings are UTF-8, and clients that check refuse a whole
    # message holding one that is not: what the coordinator keeps and sends
    # back must stay valid, also when a fixed-size copy cuts it short
    with Cluster(workers=2, name="utf8") as c:
        jid = c.submit(job_spec(name="texts", ranks=2, microbatches=4, iterations=500))
        c.wait_iterations(jid, 1)
        w0 = c.worker_of_rank(jid, 0)
        cancel = c.channel.unary_unary("/zb.v1.Zb/CancelJob")
        expect(c, INVALID, ["reason", "UTF-8"], cancel, field(1, jid.encode()) + field(2, b"stop \xff\xfe now"))
        attach = c.channel.unary_stream("/zb.v1.Zb/Attach")
        expect(c, INVALID, ["hostname", "UTF-8"], lambda *a, **k: list(attach(*a, **k)),
               field(1, b"w-odd") + field(2, b"127.0.0.1:9") + field(6, b"host\xc3"))
        expect(c, INVALID, ["worker_id", "UTF-8"], lambda *a, **k: list(attach(*a, **k)),
               field(1, b"w\xed\xa0\x80") + field(2, b"127.0.0.1:9"))  # an encoded surrogate
        report = c.channel.unary_unary("/zb.v1.Zb/Report")
        expect(c, INVALID, ["error", "UTF-8"], report,
               field(1, w0.encode()) + field(2, jid.encode()) + field(7, b"bad \xc0\xaf"))  # overlong "/"
        assert c.get(jid).state == STATE.JOB_STATE_RUNNING
        cp = c.zbctl("cancel", jid, "--reason", "caf\udcc3")  # argv bytes that are not UTF-8
        assert cp.returncode == 1 and "INVALID_ARGUMENT" in cp.stderr and "reason" in cp.stderr, cp.stderr
        # a long reason is cut at a character boundary (11 + 1 + 2k bytes overflows the odd way)
        long_reason = "a" + "\u00e9" * 300
        job = c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid, reason=long_reason), timeout=10)
        assert job.state == STATE.JOB_STATE_CANCELLED, job
        assert ("cancelled: " + long_reason).startswith(job.reason) and len(job.reason) > 100, job.reason
        assert c.get(jid).reason == job.reason
        assert [j.reason for j in c.list_jobs()] == [job.reason]
        assert c.events(jid)[-1].reason == job.reason
        assert sorted(w.id for w in c.list_workers()) == ["w0", "w1"]
        cp = c.zbctl("list", "--output", "json")
        assert cp.returncode == 0 and json.loads(cp.stdout)["jobs"][0]["reason"] == job.reason, cp.stdout


def test_strings_with_nul_are_refused():
    """protobuf-c hands strings over as C strings: GetJob("j-1\\0j-2")
    answered j-1. A NUL in any string field, nested ones included, is
    refused naming the field, and nothing is changed."""
    with Cluster(workers=2, name="nul") as c:
        one = c.submit(job_spec(name="one", ranks=2, microbatches=4, iterations=100000))
        c.wait_iterations(one, 1)
        expect(c, INVALID, ["job_id", "NUL"], c.stub.GetJob, zb_pb2.GetJobRequest(job_id=one + "\0j-2"))
        expect(c, INVALID, ["job_id", "NUL"], c.stub.CancelJob,
               zb_pb2.CancelJobRequest(job_id=one + "\0", reason="gone"))
        expect(c, INVALID, ["spec.name", "NUL"], c.stub.SubmitJob,
               zb_pb2.SubmitJobRequest(spec=job_spec(name="two\0three", ranks=1)))
        assert c.get(one).state == STATE.JOB_STATE_RUNNING
        assert [j.id for j in c.list_jobs()] == [one]


def test_payloads_that_are_not_protobuf_and_unknown_methods():
    with Cluster(workers=1, name="raw-grpc") as c:
        ch = c.channel
        garbage = [b"\x0a\x05abc", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x0a\x02\x10"]
        for method in ("/zb.v1.Zb/SubmitJob", "/zb.v1.Zb/Report", "/zb.v1.Zb/Plan",
                       "/grpc.health.v1.Health/Check"):
            call = ch.unary_unary(method)
            for g in garbage:
                expect(c, INVALID, [], call, g)
        for method in ("/zb.v1.Zb/WatchJob", "/zb.v1.Zb/Attach"):
            call = ch.unary_stream(method)
            for g in garbage:
                expect(c, INVALID, [], lambda *a, **k: list(call(*a, **k)), g)
        for method in ("/zb.v1.Zb/Nope", "/grpc.health.v1.Health/Watch", "/no.such.Service/Check", "/"):
            expect(c, grpc.StatusCode.UNIMPLEMENTED, [], ch.unary_unary(method), b"")
        # an empty payload is a valid empty message
        assert c.list_jobs() == []
        assert len(c.list_workers()) == 1


if __name__ == "__main__":
    zbsvc.run_tests(globals())
