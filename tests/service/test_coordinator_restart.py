"""zb-coordinator killed (SIGKILL) or stopped, then started again on the
same data dir and port: every job and its event history survive, in every
state (SUCCEEDED, CANCELLED, FAILED as they were; a PENDING one waits again
and runs its own schedule when workers come), and the job that was RUNNING
goes on: its workers kept running it, attach again
naming it, and it ends SUCCEEDED with every iteration reported once (the
reports the dead coordinator took for iterations it had not completed are
sent again, and counted once); workers then run the next job. A job whose
workers do not come back fails naming the rank. With mutual TLS a rank goes
back only to the worker identity that ran it: another worker certificate
naming it is refused and its reports are not counted; a store of schema
version 1 is migrated and its running job taken back as before. Job ids follow the
largest stored one as 64-bit numbers: after j-2147483647 comes
j-2147483648 (it used to overflow an int and hand out j--2147483648)."""

import os
import signal
import sqlite3
import subprocess
import time

import zbsvc
from zbsvc import STATE, Cluster, iteration_events, job_spec, rpc_error, zb_pb2

import grpc


def event_tuples(events):
    return [(e.seq, e.unix_ms, e.state, e.reason, e.iteration.SerializeToString() if e.HasField("iteration") else b"")
            for e in events]


def test_coordinator_crash_and_restart():
    with Cluster(workers=4, name="restart") as c:
        done = c.submit(job_spec(name="done-before", schedule="zb-v", iterations=3))
        c.wait_state(done, STATE.JOB_STATE_SUCCEEDED)
        done_events = c.events(done)
        cancelled = c.submit(job_spec(name="cancelled-before", schedule="1f1b", iterations=300))
        c.wait_state(cancelled, STATE.JOB_STATE_RUNNING)
        c.stub.CancelJob(zbsvc.zb_pb2.CancelJobRequest(job_id=cancelled, reason="make room"), timeout=10)
        c.wait_workers(4, idle=True)
        cancelled_events = c.events(cancelled)
        failed = c.submit(job_spec(name="failed-before", ranks=5, wait_for_workers_s=1))
        c.wait_state(failed, STATE.JOB_STATE_FAILED, timeout=30)
        failed_events = c.events(failed)

        running = c.submit(job_spec(name="interrupted", schedule="zb-h1", t=0.002, iterations=60))
        c.wait_iterations(running, 5)
        # waits for a fifth worker (it holds no plan while it waits)
        pending = c.submit(job_spec(name="waiting", ranks=5, schedule="zb-h2", iterations=3, wait_for_workers_s=600))
        before = {j.id: j for j in c.list_jobs()}
        port = c.port
        watch = subprocess.Popen(zbsvc._WRAP + [zbsvc.ZBCTL, "watch", running, "--coordinator", c.address],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        zbsvc.wait_until("zbctl watch to print", lambda: watch.stdout.readline(), 10)

        c.coordinator.kill()
        _, err = watch.communicate(timeout=30 * zbsvc.SLOW)  # a watcher of a dead coordinator ends
        assert watch.returncode == 1 and "UNAVAILABLE" in err, (watch.returncode, err)
        time.sleep(1)  # the ranks run on, their reports waiting
        c.start_coordinator(port=port)
        assert c.port == port

        jobs = {j.id: j for j in c.list_jobs()}
        assert list(jobs) == [done, cancelled, failed, running, pending], list(jobs)
        for jid in (done, cancelled, failed):
            a, b = before[jid], jobs[jid]
            assert (a.state, a.reason, a.iterations_done, a.schedule, a.spec, a.last) == \
                   (b.state, b.reason, b.iterations_done, b.schedule, b.spec, b.last), (a, b)
        assert jobs[running].state == STATE.JOB_STATE_RUNNING, jobs[running]
        assert jobs[pending].state == STATE.JOB_STATE_PENDING and jobs[pending].schedule == "zb-h2", jobs[pending]

        # histories replay as they were; the interrupted job goes on to the end
        assert event_tuples(c.events(done)) == event_tuples(done_events)
        assert event_tuples(c.events(cancelled)) == event_tuples(cancelled_events)
        assert event_tuples(c.events(failed)) == event_tuples(failed_events)
        job = c.wait_state(running, STATE.JOB_STATE_SUCCEEDED, timeout=120)
        ev = c.events(running)
        assert [e.seq for e in ev] == list(range(1, len(ev) + 1)), [e.seq for e in ev]
        its = [it.iteration for it in iteration_events(ev)]
        print("after the restart: %s, %s; iterations reported %d..%d" %
              (zbsvc.state_name(job.state), job.reason, its[0], its[-1]))
        assert its == list(range(60)), its  # every iteration once, none lost, none twice
        assert any("taken back after a coordinator restart" in e.reason for e in ev), [e.reason for e in ev]
        cp = c.zbctl("watch", done)
        assert cp.returncode == 0 and "SUCCEEDED" in cp.stdout, (cp.returncode, cp.stdout, cp.stderr)

        # the waiting job runs its own schedule once a fifth worker comes
        c.start_worker("w4")
        job = c.wait_state(pending, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        assert job.schedule == "zb-h2" and job.iterations_done == 3, job
        # the workers are free again, and new ids do not collide
        c.wait_workers(5, idle=True, timeout=20)
        nxt = c.submit(job_spec(name="after-restart", schedule="zb-v", iterations=3))
        assert nxt not in (done, cancelled, failed, running, pending), nxt
        c.wait_state(nxt, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        for w in c.workers.values():
            assert w.alive(), w.name


def test_pending_job_survives_a_crash_with_its_own_schedule():
    """A job waiting PENDING (more ranks than workers) when the coordinator
    is killed is planned anew from its stored spec after the restart, and
    runs to SUCCEEDED with its own schedule once enough workers attach (it
    was reloaded without a plan and, when workers came, ran a zeroed one)."""
    with Cluster(workers=2, name="restart-pending") as c:
        jid = c.submit(job_spec(name="waiting", ranks=4, schedule="zb-v", iterations=3, wait_for_workers_s=600))
        assert c.get(jid).state == STATE.JOB_STATE_PENDING
        port = c.port
        c.coordinator.kill()
        time.sleep(0.5)
        c.start_coordinator(port=port)
        job = c.get(jid)
        assert job.state == STATE.JOB_STATE_PENDING and job.schedule == "zb-v", job
        for k in (2, 3):
            c.start_worker("w%d" % k)
        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        assert job.iterations_done == 3 and job.schedule == "zb-v", job
        its = iteration_events(c.events(jid))
        assert [it.schedule for it in its] == ["zb-v"] * 3, [it.schedule for it in its]
        c.assert_serving()


def test_coordinator_graceful_restart():
    """SIGTERM drains the coordinator; its successor takes the job back and
    the job ends SUCCEEDED, every iteration once. Three drains in one job:
    a drain cancels the reports it holds (CANCELLED at the worker), and a
    rank whose report was in flight must send it again, not fail."""
    with Cluster(workers=2, name="graceful") as c:
        jid = c.submit(job_spec(name="drained", ranks=2, microbatches=4, t=0.002, iterations=160))
        port = c.port
        for done in (3, 30, 60):
            c.wait_iterations(jid, done)
            rc, clean = c.coordinator.stop()
            assert clean and rc == 0, rc
            c.start_coordinator(port=port)
        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
        its = [it.iteration for it in iteration_events(c.events(jid))]
        assert its == list(range(160)), its
        c.wait_workers(2, idle=True, timeout=20)
        nxt = c.submit(job_spec(name="next", ranks=2, microbatches=4, iterations=2))
        c.wait_state(nxt, STATE.JOB_STATE_SUCCEEDED, timeout=60)


def test_a_rank_that_does_not_come_back_fails_the_job():
    """A worker that hangs (SIGSTOP) while the coordinator is away never
    attaches again: the job waits for its rank for the recovery window
    (30 s), then fails naming it, and the other worker is released."""
    with Cluster(workers=2, name="norecover", heartbeat_timeout_ms=1500) as c:
        jid = c.submit(job_spec(name="orphan", ranks=2, microbatches=4, t=0.002, iterations=100000))
        c.wait_iterations(jid, 2)
        port = c.port
        hung = c.worker_of_rank(jid, 1)
        c.coordinator.kill()
        c.workers[hung].signal(signal.SIGSTOP)
        try:
            c.start_coordinator(port=port)
            job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=90)
        finally:
            c.workers[hung].kill()
        print("without rank 1: %s" % job.reason)
        assert "rank 1" in job.reason and "did not come back" in job.reason, job.reason
        c.wait_workers(1, idle=True, timeout=30)


def attach_as(stub, worker_id, **running):
    """An Attach stream as worker_id (naming running_job_id/running_rank
    when given): (stream, None) once it delivered its first command, or
    (None, (code, details)) when it was refused."""
    stream = stub.Attach(zb_pb2.AttachRequest(worker_id=worker_id, data_address="127.0.0.1:1", backends=["sim"],
                                              transports=["tcp"], **running), timeout=30 * zbsvc.SLOW)
    try:
        next(stream)
    except grpc.RpcError as e:
        return None, (e.code(), e.details() or "")
    return stream, None


FORGED_WALL = 777.0  # a figure no real rank reports


def forged_reports(stub, jid, first):
    """Reports for rank 0 of jid, iterations first.., as worker w9: the
    errors they got (each must be one)."""
    errors = []
    for it in range(first, first + 5):
        m = zb_pb2.RankIteration(rank=0, wall_seconds=FORGED_WALL)
        req = zb_pb2.ReportRequest(worker_id="w9", job_id=jid, rank=0, iteration=it, plan_version=1, metrics=m)
        errors.append(rpc_error(stub.Report, req, timeout=10 * zbsvc.SLOW))
    return errors


def test_a_recovering_rank_goes_back_only_to_the_identity_that_ran_it():
    """Mutual TLS: the store keeps which worker identity ran each rank. The
    coordinator is killed and started again while the job's workers are held
    (SIGSTOP); a foreign worker, with a valid worker certificate of another
    identity (w9), attaches first naming the job's rank 0. It is refused
    (PERMISSION_DENIED naming both identities) and not registered; neither
    its reports then, nor those it sends once attached as an idle worker,
    are counted; the rank waits. The real workers come back and the job ends
    SUCCEEDED with every iteration once, none with the forged figures.
    (Before: w9 took rank 0, the real worker was released, its forged
    reports counted and the job failed.)"""
    with Cluster(workers=2, tls=True, name="restart-owner") as c:
        c.make_certs(workers=["w9"])
        jid = c.submit(job_spec(name="owned", ranks=2, microbatches=4, t=0.002, iterations=60))
        c.wait_iterations(jid, 3)
        real = c.worker_of_rank(jid, 0)
        port = c.port
        c.coordinator.kill()
        for w in c.workers.values():  # held until w9 has tried: it attaches first
            w.signal(signal.SIGSTOP)
        try:
            c.start_coordinator(port=port)
            done = c.get(jid).iterations_done
            ch, w9 = c.stub_as("worker-w9")
            try:
                _, refused = attach_as(w9, "w9", running_job_id=jid, running_rank=0)
                print("w9 naming rank 0: %s" % (refused,))
                assert refused and refused[0] == grpc.StatusCode.PERMISSION_DENIED, refused
                assert "zb://worker/w9" in refused[1] and "zb://worker/%s" % real in refused[1], refused
                assert "w9" not in [w.id for w in c.list_workers()]
                for code, details in forged_reports(w9, jid, done):  # not attached
                    assert code == grpc.StatusCode.UNAVAILABLE and "w9" in details, (code, details)
                stream, _ = attach_as(w9, "w9")  # as an idle worker it may attach
                assert stream is not None
                try:
                    for code, details in forged_reports(w9, jid, done):
                        assert code == grpc.StatusCode.UNAVAILABLE and "waits for its ranks" in details, details
                finally:
                    stream.cancel()
            finally:
                ch.close()
            job = c.get(jid)
            assert job.state == STATE.JOB_STATE_RUNNING and "waiting for its 2 ranks" in job.reason, job
        finally:
            for w in c.workers.values():
                w.signal(signal.SIGCONT)
        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
        its = iteration_events(c.events(jid))
        assert [it.iteration for it in its] == list(range(60)), [it.iteration for it in its]
        assert not any(r.wall_seconds == FORGED_WALL for it in its for r in it.ranks), "a forged report counted"
        log = c.coordinator.log_text()
        assert "zb://worker/w9 named rank 0, which zb://worker/%s ran: refused" % real in log, c.coordinator.tail()
        assert "rank 0 back on worker %s, zb://worker/%s" % (real, real) in log, c.coordinator.tail()
        c.assert_serving()


def test_a_job_from_a_version_1_store_is_taken_back():
    """The coordinator is killed mid-job and its store turned back into
    schema version 1 (no rank_owners column, user_version 1): the next
    coordinator migrates it in place, takes the job back from its first
    workers naming the ranks (the store does not say who ran them; it warns
    so), keeps those as the ranks' owners from then on, and the job ends
    SUCCEEDED, every iteration once."""
    with Cluster(workers=2, name="restart-v1") as c:
        jid = c.submit(job_spec(name="old-store", ranks=2, microbatches=4, t=0.002, iterations=60))
        c.wait_iterations(jid, 3)
        ranks = [c.worker_of_rank(jid, r) for r in range(2)]
        port = c.port
        c.coordinator.kill()
        db = sqlite3.connect(os.path.join(c.data_dir, "zb.db"))
        db.execute("ALTER TABLE jobs DROP COLUMN rank_owners")
        for index in ("events_by_iteration", "events_traced"):  # version 3's
            db.execute("DROP INDEX %s" % index)
        for column in ("iteration_no", "traced"):
            db.execute("ALTER TABLE events DROP COLUMN %s" % column)
        db.execute("PRAGMA user_version = 1")
        db.commit()
        db.close()
        c.start_coordinator(port=port)
        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
        its = [it.iteration for it in iteration_events(c.events(jid))]
        assert its == list(range(60)), its
        log = c.coordinator.log_text()
        assert "the store does not say which workers ran its ranks" in log, c.coordinator.tail()
        db = sqlite3.connect(os.path.join(c.data_dir, "zb.db"))
        try:
            assert db.execute("PRAGMA user_version").fetchone()[0] == 3
            owners = db.execute("SELECT rank_owners FROM jobs WHERE id = ?", (jid,)).fetchone()[0]
        finally:
            db.close()
        # the workers that took the ranks back are its owners from then on
        assert owners == b"insecure:%s\0insecure:%s\0" % (ranks[0].encode(), ranks[1].encode()), owners
        print("migrated store: %s %s" % (zbsvc.state_name(job.state), job.reason))


def test_paused_coordinator_does_not_leave_a_job_hanging():
    # SIGSTOP holds the coordinator past the workers' report deadline (5 s)
    # and its heartbeat timeout: the ranks retry their reports and the job
    # goes on (neither waiting forever nor failed by the pause), and the
    # coordinator does not blame its own pause on the workers' heartbeats.
    with Cluster(workers=2, name="pause") as c:
        jid = c.submit(job_spec(name="paused", ranks=2, microbatches=4, iterations=100000))
        c.wait_iterations(jid, 1)
        c.coordinator.signal(signal.SIGSTOP)
        try:
            time.sleep(7)
        finally:
            c.coordinator.signal(signal.SIGCONT)
        before = c.get(jid).iterations_done
        job = c.wait_iterations(jid, before + 5, timeout=30)
        print("after the pause: %s, %d -> %d iterations" % (zbsvc.state_name(job.state), before,
                                                            job.iterations_done))
        assert job.state == STATE.JOB_STATE_RUNNING, job
        assert not any("cannot report iteration" in w.log_text() for w in c.workers.values())
        c.stub.CancelJob(zbsvc.zb_pb2.CancelJobRequest(job_id=jid, reason="done"), timeout=10)
        c.wait_workers(2, idle=True, timeout=20)
        nxt = c.submit(job_spec(name="after-pause", ranks=2, microbatches=4, iterations=2))
        c.wait_state(nxt, STATE.JOB_STATE_SUCCEEDED, timeout=60)


def test_job_ids_do_not_overflow():
    with Cluster(workers=2, name="ids") as c:
        jid = c.submit(job_spec(name="first", ranks=2, microbatches=4, iterations=2))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        port = c.port
        rc, clean = c.coordinator.stop()
        assert clean and rc == 0, rc
        db = sqlite3.connect(os.path.join(c.data_dir, "zb.db"))
        db.execute("UPDATE jobs SET id = 'j-2147483647' WHERE id = ?", (jid,))
        db.execute("UPDATE events SET job_id = 'j-2147483647' WHERE job_id = ?", (jid,))
        db.commit()
        db.close()
        c.start_coordinator(port=port)
        c.wait_workers(2)
        ids = [c.submit(job_spec(name="next%d" % k, ranks=2, microbatches=4, iterations=2)) for k in range(2)]
        assert ids == ["j-2147483648", "j-2147483649"], ids
        assert c.get("j-2147483647").state == STATE.JOB_STATE_SUCCEEDED
        for jid in ids:
            c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
