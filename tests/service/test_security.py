"""Mutual TLS and roles on the control plane (docs/operations.md,
Security): a real zb-coordinator and zb-workers with certificates from
scripts/make-certs.sh. Every unauthorized action of the threat model fails
with PERMISSION_DENIED or UNAUTHENTICATED and changes nothing; the
legitimate flows work; certificates from another CA, expired ones and
plaintext clients are refused; insecure mode says so."""

import ctypes
import os
import time

import zbsvc
from zbsvc import STATE, Cluster, health_pb2, iteration_events, job_spec, rpc_error, zb_pb2

import grpc

DENIED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
TCP_VERSION = 4  # the data plane's handshake version (worker/transport_tcp.h)


def attach_error(stub, worker_id):
    """Opens an Attach stream as worker_id; returns how it ended (code,
    details), or None if it delivered a command."""
    stream = stub.Attach(zb_pb2.AttachRequest(worker_id=worker_id, data_address="127.0.0.1:1", backends=["sim"],
                                              transports=["tcp"]), timeout=5 * zbsvc.SLOW)
    try:
        next(stream)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    stream.cancel()
    return None


def report(stub, **kw):
    return stub.Report(zb_pb2.ReportRequest(**kw), timeout=5 * zbsvc.SLOW)


def expect(label, code_details, codes=DENIED, text=None):
    code, details = code_details
    assert code in codes, "%s: %s %s" % (label, code, details)
    assert text is None or text in details, "%s: %s" % (label, details)
    print("refused  %-58s %s: %s" % (label, code.name, details[:90]))


def test_unauthorized_actions_fail_and_change_nothing():
    with Cluster(workers=2, tls=True, name="sec") as c:
        c.make_certs(workers=["w9"])  # a worker of the cluster that is not attached
        jid = c.submit(job_spec(name="alices", ranks=2, microbatches=4, schedule="1f1b", iterations=100000))
        c.wait_iterations(jid, 2)
        job = c.get(jid)
        assert job.spec.owner == "alice", job.spec.owner
        bob_ch, bob = c.stub_as("user-bob")
        w9_ch, w9 = c.stub_as("worker-w9")
        anon_ch, anon = c.stub_as(None)  # TLS, no client certificate
        w0 = c.workers["w0"]
        try:
            # 1-3: another user's job: cancel, switch its schedule, read it
            expect("bob cancels alice's job", rpc_error(bob.CancelJob, zb_pb2.CancelJobRequest(job_id=jid),
                                                        timeout=5))
            expect("bob switches its schedule",
                   rpc_error(bob.UpdateSchedule, zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-h1"),
                             timeout=5))
            expect("bob reads it", rpc_error(bob.GetJob, zb_pb2.GetJobRequest(job_id=jid), timeout=5))
            expect("bob watches it", rpc_error(lambda: list(bob.WatchJob(zb_pb2.WatchJobRequest(job_id=jid),
                                                                          timeout=5))))
            expect("bob resumes it", rpc_error(bob.SubmitJob, zb_pb2.SubmitJobRequest(resume_from_job_id=jid),
                                               timeout=5))
            listed = bob.ListJobs(zb_pb2.ListJobsRequest(), timeout=5).jobs
            assert jid not in [j.id for j in listed], listed
            # 4-6: forged reports: a failure, iterations, heartbeats for a worker
            expect("bob (a user) reports rank 0 failed",
                   rpc_error(report, bob, worker_id="w0", job_id=jid, rank=0, error="forged"))
            expect("worker w9 reports as w0",
                   rpc_error(report, w9, worker_id="w0", job_id=jid, rank=0, error="forged"))
            expect("worker w9 reports w0's iterations done",
                   rpc_error(report, w9, worker_id="w0", job_id=jid, rank=0, iteration=99999, done=True))
            expect("worker w9 heartbeats for w0", rpc_error(report, w9, worker_id="w0"))
            expect("no certificate: heartbeat for w0", rpc_error(report, anon, worker_id="w0"))
            # 7-8: attach as a fake worker, or with a real worker's id
            expect("bob attaches as a worker", attach_error(bob, "fake"))
            expect("worker w9 attaches as w0", attach_error(w9, "w0"))
            expect("no certificate: attach", attach_error(anon, "anon"))
            # 9-10: no certificate, or a worker's, for the users' calls
            expect("no certificate: submit", rpc_error(anon.SubmitJob, zb_pb2.SubmitJobRequest(
                spec=job_spec(ranks=1, microbatches=1)), timeout=5), codes=(grpc.StatusCode.UNAUTHENTICATED,))
            expect("no certificate: list workers", rpc_error(anon.ListWorkers, zb_pb2.ListWorkersRequest(),
                                                             timeout=5))
            expect("worker w9 submits a job", rpc_error(w9.SubmitJob, zb_pb2.SubmitJobRequest(
                spec=job_spec(ranks=1, microbatches=1)), timeout=5), codes=(grpc.StatusCode.PERMISSION_DENIED,))
            expect("worker w9 lists jobs", rpc_error(w9.ListJobs, zb_pb2.ListJobsRequest(), timeout=5))
            # the health check needs no certificate (probes)
            assert c.health(channel=anon_ch) == health_pb2.HealthCheckResponse.SERVING
        finally:
            for ch in (bob_ch, w9_ch, anon_ch):
                ch.close()
        # nothing changed: still running on its workers, its plan and events its own
        time.sleep(0.5)
        after = c.get(jid)
        assert after.state == STATE.JOB_STATE_RUNNING, after
        assert after.iterations_done > job.iterations_done, (job.iterations_done, after.iterations_done)
        assert w0.alive() and sorted(w.id for w in c.list_workers() if w.job_id == jid) == ["w0", "w1"]
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid, reason="done"), timeout=5)
        evs = c.events(jid)
        its = iteration_events(evs)
        assert all(it.schedule == "1f1b" for it in its), set(it.schedule for it in its)
        assert not any(e.state == STATE.JOB_STATE_FAILED for e in evs), [e.reason for e in evs]
        c.assert_serving()


def test_legitimate_flows():
    with Cluster(workers=2, tls=True, name="sec-ok") as c:
        # a user: submit (zbctl with its certificate), watch, update, cancel its own job
        cp = c.zbctl("submit", "-", input=zbsvc.job_yaml(name="mine", ranks=2, microbatches=4, iterations=3))
        assert cp.returncode == 0, cp.stderr
        done = cp.stdout.strip()
        cp = c.zbctl("watch", done)
        assert cp.returncode == 0 and "SUCCEEDED" in cp.stdout, (cp.stdout, cp.stderr)
        cp = c.zbctl("get", done, "--output", "json")
        assert cp.returncode == 0 and '"owner": "alice"' in cp.stdout, cp.stdout
        jid = c.submit(job_spec(name="long", ranks=2, microbatches=4, iterations=100000))
        c.wait_iterations(jid, 1)
        resp = c.stub.UpdateSchedule(zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-h1"), timeout=10)
        assert resp.from_iteration >= 1, resp
        # an admin acts on every job
        root_ch, root = c.stub_as("admin-root")
        try:
            assert root.GetJob(zb_pb2.GetJobRequest(job_id=jid), timeout=5).spec.owner == "alice"
            assert {j.id for j in root.ListJobs(zb_pb2.ListJobsRequest(), timeout=5).jobs} == {done, jid}
            cancelled = root.CancelJob(zb_pb2.CancelJobRequest(job_id=jid, reason="by root"), timeout=5)
            assert cancelled.state == STATE.JOB_STATE_CANCELLED, cancelled
        finally:
            root_ch.close()
        # a client's owner field is never taken
        spec = job_spec(name="claims", ranks=1, microbatches=1, iterations=1)
        spec.owner = "root"
        other = c.submit(spec)
        assert c.get(other).spec.owner == "alice"
        assert c.health(service="zb.v1.Zb.tls") == health_pb2.HealthCheckResponse.SERVING
        c.assert_serving()


def refused_at_handshake(c, **kw):
    ch = c.open_channel(**kw)
    try:
        code, details = rpc_error(zb_pb2_grpc_stub(ch).ListWorkers, zb_pb2.ListWorkersRequest(), timeout=3)
    finally:
        ch.close()
    return code, details


def zb_pb2_grpc_stub(ch):
    return zbsvc.zb_pb2_grpc.ZbStub(ch)


def test_foreign_expired_and_plaintext_clients_are_refused():
    with Cluster(workers=1, tls=True, name="sec-ca") as c:
        other = os.path.join(c.dir, "other-ca")
        c.make_certs(users=["mallory"], ca_dir=other)  # a CA of its own
        c.make_certs(users=["late"], days=-1)  # the cluster's CA, expired
        unavailable = (grpc.StatusCode.UNAVAILABLE,)
        expect("a certificate from another CA", refused_at_handshake(c, who="user-mallory", ca_dir=other),
               codes=unavailable)
        expect("an expired certificate", refused_at_handshake(c, who="user-late"), codes=unavailable)
        plain = zbsvc.grpc.insecure_channel(c.address)
        try:
            expect("a plaintext client", rpc_error(zb_pb2_grpc_stub(plain).ListWorkers, zb_pb2.ListWorkersRequest(),
                                                   timeout=3), codes=unavailable)
        finally:
            plain.close()
        # a worker with another CA's certificate never attaches
        c.make_certs(workers=["rogue"], ca_dir=other)
        ca, cert, key = c.cert_paths("worker-rogue", other)
        c.start_worker("rogue", extra=["--tls-ca", c.cert_paths("coordinator")[0], "--tls-cert", cert,
                                       "--tls-key", key])
        time.sleep(1.5)
        assert [w.id for w in c.list_workers()] == ["w0"], c.list_workers()
        c.assert_serving()


def sign_by_hand(c, name, san):
    """A certificate of the cluster's CA with exactly the SAN text san (what
    scripts/make-certs.sh never writes), as c.cert_paths(name)."""
    import subprocess
    import tempfile
    d = os.path.join(c.dir, "certs")
    with tempfile.NamedTemporaryFile("w", suffix=".ext", delete=False) as ext:
        ext.write("subjectAltName=%s\nextendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n"
                  "keyUsage=critical,digitalSignature\n" % san)
    key, csr, pem = (os.path.join(d, name + x) for x in (".key", ".csr", ".pem"))
    for argv in (["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                  "-subj", "/O=zb/CN=" + name, "-keyout", key, "-out", csr],
                 ["openssl", "x509", "-req", "-in", csr, "-CA", os.path.join(d, "ca.pem"), "-CAkey",
                  os.path.join(d, "ca.key"), "-CAcreateserial", "-extfile", ext.name, "-out", pem, "-days", "2"]):
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, cp.stderr
    os.unlink(ext.name)


def test_only_one_zb_uri_names_an_identity():
    """Only a URI SAN with the zb:// scheme names who a certificate is: a
    cluster-CA certificate whose DNS or email SAN reads zb://admin/... is
    nobody, one with two zb:// URIs is nobody (not the first of them), and
    neither can cancel another user's job."""
    with Cluster(workers=1, tls=True, name="sec-san") as c:
        jid = c.submit(job_spec(ranks=1, microbatches=2, iterations=100000))
        c.wait_iterations(jid, 1)
        forged = [("dns-admin", "DNS:zb://admin/evil"), ("email-admin", "email:zb://admin/evil"),
                  ("two-uris", "URI:zb://admin/evil,URI:zb://user/alice"),
                  ("two-uris-user-first", "URI:zb://user/alice,URI:zb://admin/evil")]
        for name, san in forged:
            sign_by_hand(c, name, san)
            ch = c.open_channel(who=name)
            try:
                stub = zb_pb2_grpc_stub(ch)
                expect("%s cancels a job" % san,
                       rpc_error(stub.CancelJob, zb_pb2.CancelJobRequest(job_id=jid, reason="evil"), timeout=5),
                       codes=(grpc.StatusCode.UNAUTHENTICATED,), text="zb://ROLE/NAME")
            finally:
                ch.close()
        sign_by_hand(c, "one-uri", "DNS:localhost,URI:zb://user/bob,URI:https://example.invalid/x")
        ch = c.open_channel(who="one-uri")  # one zb:// URI among others names bob
        try:
            expect("bob cancels alice's job", rpc_error(zb_pb2_grpc_stub(ch).CancelJob,
                                                        zb_pb2.CancelJobRequest(job_id=jid), timeout=5),
                   codes=(grpc.StatusCode.PERMISSION_DENIED,), text="another user than bob")
        finally:
            ch.close()
        assert c.get(jid).state == STATE.JOB_STATE_RUNNING
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10)
        c.assert_serving()


def test_insecure_mode_says_so():
    with Cluster(workers=1, name="sec-insecure") as c:
        assert c.health(service="zb.v1.Zb.tls") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert "INSECURE MODE" in c.coordinator.log_text(), c.coordinator.tail()
        c.assert_serving()


def test_bad_tls_config_is_refused():
    with Cluster(workers=0, tls=True, name="sec-conf") as c:
        ca, cert, key = c.cert_paths("coordinator")
        for flags, text in ((["--tls-ca", ca, "--tls-cert", cert], "key file not given"),
                            (["--tls-ca", ca, "--tls-cert", cert, "--tls-key", "/nonexistent/k.pem"],
                             "/nonexistent/k.pem"),
                            (["--tls-ca", ca, "--tls-cert", ca + ".nope", "--tls-key", key], "cert")):
            argv = [zbsvc.COORDINATOR, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                    "--data-dir", os.path.join(c.dir, "d2")] + flags
            cp = zbsvc.subprocess.run(zbsvc._WRAP + argv, capture_output=True, text=True, timeout=30 * zbsvc.SLOW)
            assert cp.returncode != 0 and text in cp.stderr, (flags, cp.returncode, cp.stderr)
        cp = c.zbctl("workers", "--tls-key", "/nonexistent/key.pem")
        assert cp.returncode == 2 and "/nonexistent/key.pem" in cp.stderr, cp.stderr


def fnv1a(text):
    h = 1469598103934665603
    for b in text.encode():
        h = ((h ^ b) * 1099511628211) % (1 << 64)
    return h


def test_data_plane_stranger_cannot_join():
    """A stranger who knows the next job's id connects to rank 1's data port
    before the job starts and claims to be rank 0 (the old race: it won 12
    of 14). Without the job's data secret it cannot answer the handshake:
    it is dropped, the real rank 0 connects, the job succeeds, and nothing
    the stranger sent reached a rank."""
    import socket
    import struct
    import threading
    with Cluster(workers=2, tls=True, name="sec-data") as c:
        first = c.submit(job_spec(name="first", ranks=2, microbatches=4, iterations=1))
        c.wait_state(first, STATE.JOB_STATE_SUCCEEDED)
        c.wait_workers(2)
        nxt = "j-%d" % (int(first.split("-")[1]) + 1)  # ids are sequential
        rank1 = [w for w in c.list_workers() if w.id == "w1"][0].data_address
        host, port = rank1.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10 * zbsvc.SLOW)
        s.sendall(struct.pack("<4sIIIQ16s32s", b"ZBHL", TCP_VERSION, 0, 2, fnv1a(nxt), b"\0" * 16, b"\0" * 32))
        outcome = {}

        def stranger():
            try:
                answer = b""
                while len(answer) < 72:
                    chunk = s.recv(72 - len(answer))
                    if not chunk:
                        break
                    answer += chunk
                outcome["answered"] = answer[:4]
                s.sendall(struct.pack("<4sIIIQ16s32s", b"ZBPF", TCP_VERSION, 0, 2, fnv1a(nxt), b"\0" * 16,
                                      b"\xab" * 32))
                s.sendall(struct.pack("<4sIiiQ16s", b"ZBMS", ord("F"), 0, 0, 16, b"\0" * 16) + b"\x7f" * 32)  # inject
                outcome["closed"] = s.recv(1) == b""
            except OSError as e:  # closed on it while it wrote (dropped too), or never served
                outcome["closed"] = isinstance(e, (ConnectionResetError, BrokenPipeError))
                outcome["error"] = str(e)

        th = threading.Thread(target=stranger)
        th.start()
        jid = c.submit(job_spec(name="victim", ranks=2, microbatches=4, iterations=5))
        assert jid == nxt, (jid, nxt)
        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        th.join(30 * zbsvc.SLOW)
        s.close()
        print("stranger: %s; job %s %s after %d iterations" % (outcome, jid, zbsvc.state_name(job.state),
                                                               job.iterations_done))
        # it was answered and then dropped for its forged proof, or (the real
        # rank 0 connected first) never served at all: never a rank either way
        served = outcome.get("answered") == b"ZBHL"
        assert (served and outcome.get("closed")) or (not served and not outcome.get("answered")), outcome
        assert job.iterations_done == 5, job
        c.assert_serving()


def cpu_job(name, **model):
    m = zb_pb2.ModelSpec(hidden=16, heads=2, layers=2, seq_len=8, batch=2, seed=3, **model)
    return zb_pb2.JobSpec(name=name, ranks=2, microbatches=2, schedule="1f1b", iterations=2, backend="cpu",
                          model=m)


def test_path_roots_confine_job_paths():
    """A worker with --path-root refuses job-spec paths outside it, through
    '..' or a symbolic link too; the job fails naming the path. A job with
    an architecture reads its shards and weights beneath the root
    (arch_paths_beneath_root)."""
    root = zbsvc.tempfile.mkdtemp(prefix="zb-root-")
    outside = zbsvc.tempfile.mkdtemp(prefix="zb-outside-")
    try:
        os.symlink(outside, os.path.join(root, "escape"))
        with open(os.path.join(outside, "secret.txt"), "w") as f:
            f.write("x" * 4096)
        with Cluster(workers=2, name="sec-paths", worker_args=lambda k: ["--path-root", root]) as c:
            bad = [("model.checkpoint_dir", dict(checkpoint_every=1, checkpoint_dir=outside)),
                   ("model.data", dict(data="/etc/passwd")),
                   ("model.dump_dir", dict(dump_dir=os.path.join(root, "..", os.path.basename(outside)))),
                   ("model.data", dict(data=os.path.join(root, "escape", "secret.txt"))),
                   ("model.checkpoint_dir", dict(checkpoint_every=1, checkpoint_dir=os.path.join(root, "escape",
                                                                                                "new")))]
            text = os.path.join(root, "text.txt")  # the default text is outside the root
            with open(text, "w") as f:
                f.write("the quick brown fox jumps over the lazy dog " * 20)
            for what, model in bad:
                jid = c.submit(cpu_job("bad", **dict(dict(data=text), **model)))
                job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=60)
                assert what in job.reason and "outside this worker's path roots" in job.reason, job.reason
                print("refused  %-58s %s" % (what, job.reason[:110]))
                c.wait_workers(2)
            assert os.listdir(outside) == ["secret.txt"], os.listdir(outside)  # nothing written there
            jid = c.submit(cpu_job("good", data=text, checkpoint_every=1,
                                   checkpoint_dir=os.path.join(root, "ck", "new")))
            c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
            assert os.listdir(os.path.join(root, "ck", "new", jid)), "no checkpoint written inside the root"
            arch_paths_beneath_root(c, root, outside)
            c.assert_serving()
    finally:
        zbsvc.shutil.rmtree(root, ignore_errors=True)
        zbsvc.shutil.rmtree(outside, ignore_errors=True)


DATA = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))


def llama_job(name, data, weights):
    """A 2-iteration llama job (the transformers fixture's config) on 2 ranks."""
    with open(os.path.join(DATA, "hf", "llama", "config.json")) as f:
        config = f.read()
    m = zb_pb2.ModelSpec(architecture="llama", config_json=config, data=data, weights=weights, seq_len=16,
                         batch=2, seed=3)
    return zb_pb2.JobSpec(name=name, ranks=2, microbatches=2, schedule="1f1b", iterations=2, backend="cpu",
                          model=m)


def arch_paths_beneath_root(c, root, outside):
    """Jobs with an architecture on workers with --path-root: their token
    shards (a glob) and weights beneath the root train; weights or a shard
    that are a symbolic link out of it fail the job naming the path."""
    tokens, weights, linked = (os.path.join(root, d) for d in ("tokens", "llama", "linked"))
    for d in (tokens, weights, linked, os.path.join(outside, "llama")):
        os.makedirs(d)
    for f in sorted(os.listdir(os.path.join(DATA, "tokens"))):
        if f.endswith(".bin"):
            zbsvc.shutil.copy(os.path.join(DATA, "tokens", f), tokens)
    for d in (weights, os.path.join(outside, "llama")):
        zbsvc.shutil.copy(os.path.join(DATA, "hf", "llama", "model.safetensors"), d)
    shards = os.path.join(tokens, "gpl3_*.bin")
    jid = c.submit(llama_job("arch-good", shards, weights))
    job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
    assert job.iterations_done == 2, job
    print("trained  llama from %s on %s beneath the root" % (weights, shards))
    # the weights file a link out of the root: refused at its open, named
    os.symlink(os.path.join(outside, "llama", "model.safetensors"), os.path.join(linked, "model.safetensors"))
    # a shard that is a link out of the root, among real ones
    zbsvc.shutil.copy(os.path.join(tokens, "gpl3_000000.bin"), outside)
    mixed = os.path.join(root, "mixed")
    os.makedirs(mixed)
    zbsvc.shutil.copy(os.path.join(tokens, "gpl3_000001.bin"), mixed)
    os.symlink(os.path.join(outside, "gpl3_000000.bin"), os.path.join(mixed, "gpl3_000000.bin"))
    bad = [("model.weights", os.path.join(linked, "model.safetensors"), llama_job("arch-linked", shards, linked)),
           ("model.weights", os.path.join(root, "escape"),
            llama_job("arch-escape", shards, os.path.join(root, "escape"))),
           ("model.data", os.path.join(mixed, "gpl3_000000.bin"),
            llama_job("arch-mixed", os.path.join(mixed, "gpl3_*.bin"), weights))]
    zbsvc.shutil.copy(os.path.join(DATA, "hf", "llama", "model.safetensors"), outside)  # what escape/ holds
    for what, path, spec in bad:
        jid = c.submit(spec)
        job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=120)
        assert what in job.reason and path in job.reason, job.reason
        assert "symbolic link" in job.reason or "outside this worker's path roots" in job.reason, job.reason
        print("refused  %-58s %s" % (what, job.reason[:150]))
        c.wait_workers(2)


_libc = ctypes.CDLL(None, use_errno=True)


def exchange(a, b):
    """Swaps two names atomically: renameat2(2) with RENAME_EXCHANGE."""
    if _libc.renameat2(-100, a.encode(), -100, b.encode(), 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), a)


def swap_for_link(d, link_to):
    """Puts a symbolic link to link_to in directory d's place for a moment,
    then d back, each in one atomic exchange, so the worker never finds d
    missing, only a link. True when the link was in place."""
    link = d + ".link"
    try:
        os.symlink(link_to, link)
    except OSError:
        return False
    try:
        exchange(d, link)  # d is the link now, d.link the directory
    except FileNotFoundError:  # d is not there (yet): nothing to swap
        os.unlink(link)
        return False
    time.sleep(0.002)
    exchange(d, link)
    os.unlink(link)
    return True


def test_path_roots_hold_while_a_job_runs():
    """The finding of issue 28 (item 6): the path roots were checked once,
    at job start, so a worker went on writing checkpoints and dumps through
    directories swapped for links to outside the root. A cpu job writing a
    checkpoint and a dump every iteration under the root runs while its
    checkpoint and dump directories (the job's and their parents) are
    swapped again and again for links to a directory outside: nothing is
    ever written outside, and the job either goes on writing inside (then
    it is cancelled) or fails naming the path that held a link. The swaps
    are atomic exchanges, so the worker never meets a missing directory.
    (A worker that checked the paths at job start only wrote 19 and 50
    files outside in two runs of this test.)"""
    root = os.path.realpath(zbsvc.tempfile.mkdtemp(prefix="zb-root-"))
    outside = zbsvc.tempfile.mkdtemp(prefix="zb-outside-")
    try:
        text = os.path.join(root, "text.txt")
        with open(text, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog " * 20)
        with Cluster(workers=2, name="sec-swaps", worker_args=lambda k: ["--path-root", root]) as c:
            ck, dump = os.path.join(root, "ck"), os.path.join(root, "dump")
            spec = cpu_job("swapped", data=text, checkpoint_every=1, checkpoint_dir=ck, dump_dir=dump,
                           dump_every=1)
            spec.iterations = 1000000  # runs until the swaps are done, then is cancelled
            jid = c.submit(spec)
            c.wait_iterations(jid, 2, timeout=60)
            targets = [os.path.join(ck, jid), os.path.join(dump, jid), ck, dump]
            swaps = cycles = 0
            ended = False
            while cycles < 400 and not ended:
                swaps += swap_for_link(targets[cycles % len(targets)], outside)
                cycles += 1
                ended = cycles % 10 == 0 and c.get(jid).state in zbsvc.TERMINAL
            if c.get(jid).state not in zbsvc.TERMINAL:
                c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid, reason="swaps done"),
                                 timeout=10 * zbsvc.SLOW)
            job = c.wait_state(jid, [STATE.JOB_STATE_FAILED, STATE.JOB_STATE_CANCELLED], timeout=60)
            c.wait_workers(2)
            written = [os.path.join(d, f) for d, _, files in os.walk(outside) for f in files]
            print("%d links planted in %d swaps; job %s after %d iterations: %s; outside holds %d files" %
                  (swaps, cycles, zbsvc.state_name(job.state), job.iterations_done, job.reason[:150],
                   len(written)))
            assert swaps > 0, "no directory was ever swapped for a link"
            assert written == [], "written outside the root: %s" % written[:5]
            if job.state == STATE.JOB_STATE_FAILED:
                assert root in job.reason and "symbolic link" in job.reason, job.reason
            else:
                inside = [f for d, _, files in os.walk(root) for f in files if f.endswith((".ckpt", ".dump"))]
                assert inside, "cancelled, yet nothing was written inside the root"
            c.assert_serving()
    finally:
        zbsvc.shutil.rmtree(root, ignore_errors=True)
        zbsvc.shutil.rmtree(outside, ignore_errors=True)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
