"""The heartbeat period the coordinator asks of its workers (docs/wire.md,
Heartbeats), with a 1500 ms heartbeat timeout: a fifth of it (300 ms) for
a few workers, 5 ms per attached worker above that, and at most two
fifths (600 ms). The ping at attach carries Command.heartbeat_ms; when
many workers attach, every attached stream is told the longer period,
once; when they leave again, the few left are told the short one; an idle
stream gets no other Command (no periodic pings). A real zb-worker (its
own --heartbeat-ms 200) takes the longer period asked and stays attached.

The many workers are this test speaking the worker's side of zb.v1: an
Attach stream each, read on a thread, and Reports from one thread, over
two connections (one connection holds at most 100 streams)."""

import threading

import grpc

import zbsvc
from zbsvc import SLOW, Cluster, job_spec, wait_until, zb_pb2, zb_pb2_grpc

TIMEOUT_MS = 1500
FEW_MS, MANY_MS = TIMEOUT_MS // 5, 2 * TIMEOUT_MS // 5
MANY = 130  # 130 x 5 ms is past two fifths of the timeout


class FakeWorker:
    """An Attach stream whose Commands' heartbeat_ms land in a list."""

    def __init__(self, stub, wid):
        self.stub, self.id = stub, wid
        self.periods = []  # heartbeat_ms of every Command, in order
        self.call = stub.Attach(zb_pb2.AttachRequest(worker_id=wid, data_address="127.0.0.1:1",
                                                     backends=["sim"], transports=["tcp"]))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        try:
            for cmd in self.call:
                self.periods.append(cmd.heartbeat_ms)
        except grpc.RpcError:
            pass  # cancelled at close

    def close(self):
        self.call.cancel()
        self.reader.join(timeout=10)


class Beater:
    """Heartbeat Reports for every fake worker in `workers`, every 250 ms."""

    def __init__(self, workers):
        self.workers, self.stop = workers, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.wait(0.25):
            futures = [w.stub.Report.future(zb_pb2.ReportRequest(worker_id=w.id), timeout=5 * SLOW)
                       for w in list(self.workers)]
            for f in futures:
                try:
                    f.result()
                except grpc.RpcError:
                    pass

    def close(self):
        self.stop.set()
        self.thread.join(timeout=30)


def attached(c):
    return len(c.list_workers())


def test_period_grows_with_the_workers_and_comes_back():
    with Cluster(workers=0, heartbeat_timeout_ms=TIMEOUT_MS, name="heartbeats") as c:
        # two connections of their own (not one shared by every channel)
        channels = [grpc.insecure_channel(c.address, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(2)]
        stubs = [zb_pb2_grpc.ZbStub(ch) for ch in channels]
        workers = []
        beater = Beater(workers)
        try:
            first = FakeWorker(stubs[0], "hb-0")
            workers.append(first)
            wait_until("the ping at attach", lambda: first.periods, 10)
            assert first.periods == [FEW_MS], first.periods

            for k in range(1, MANY):
                workers.append(FakeWorker(stubs[k % 2], "hb-%d" % k))
            wait_until("%d workers attached" % MANY, lambda: attached(c) == MANY, 30)
            wait_until("every stream told %d ms" % MANY_MS,
                       lambda: all(w.periods and w.periods[-1] == MANY_MS for w in workers), 15)
            # 300, then past 20% more each time (365, 440, 530) or the bound (600)
            assert first.periods[-1] == MANY_MS and len(first.periods) <= 5, first.periods
            for w in workers:  # each period told at most once, never a step per worker
                assert len(w.periods) == len(set(w.periods)), (w.id, w.periods)
                assert all(FEW_MS <= p <= MANY_MS for p in w.periods), (w.id, w.periods)

            # an idle stream gets nothing more: no periodic pings
            told = [len(w.periods) for w in workers]
            threading.Event().wait(2.0)
            assert [len(w.periods) for w in workers] == told

            # most leave: the few left are told the short period again
            leaving, staying = workers[5:], workers[:5]
            del workers[5:]
            for w in leaving:
                w.close()
            wait_until("5 workers attached", lambda: attached(c) == 5, 30)
            wait_until("the workers left told %d ms" % FEW_MS,
                       lambda: all(w.periods[-1] == FEW_MS for w in staying), 15)
        finally:
            beater.close()
            for w in workers:
                w.close()
            for ch in channels:
                ch.close()


def test_a_worker_beats_at_the_period_asked():
    """zb-worker --heartbeat-ms 200 under a coordinator that asks for 300 ms
    takes the longer period (its log says so), stays attached past the
    timeout and runs a job."""
    with Cluster(workers=0, heartbeat_timeout_ms=TIMEOUT_MS, name="heartbeat-period") as c:
        w = c.start_worker("w0", extra=("--log-level", "debug"))
        c.wait_workers(1)
        want = "heartbeat every %d ms (the coordinator asks for %d, --heartbeat-ms 200)" % (FEW_MS, FEW_MS)
        wait_until("the worker to take the period", lambda: want in w.log_text(), 10)
        threading.Event().wait(2 * TIMEOUT_MS / 1000)
        assert [x.id for x in c.wait_workers(1)] == ["w0"]
        c.start_worker("w1")
        c.wait_workers(2)
        jid = c.submit(job_spec(name="beating", ranks=2, iterations=3))
        c.wait_state(jid, zbsvc.STATE.JOB_STATE_SUCCEEDED, timeout=60)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
