"""The agent's gRPC side (docs/pytorch.md, Attaching a torchrun job): the
channel (mutual TLS or plaintext, as zb-worker), the Attach stream read by
one thread into a queue, heartbeats from another, and Reports with the
clock-offset estimate zb-worker keeps (docs/wire.md, Timelines).

Ownership: a Link owns its channel and both threads; close() cancels the
stream, stops the heartbeats and joins both threads (bounded waits).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

try:
    import grpc
    from zb.v1 import zb_pb2, zb_pb2_grpc
except ImportError as e:  # the optional extra, or a build without grpcio-tools
    grpc = None
    _IMPORT_ERROR = e
else:
    _IMPORT_ERROR = None


from zb import ZbError


class AttachError(ZbError, RuntimeError):
    """The agent could not attach, lost the coordinator, was refused, or
    its job failed. A zb.ZbError, the package's one error family, so
    `except zb.ZbError` catches it; also a RuntimeError, as it was before
    (ZbError itself is a ValueError: a refused request). code: the gRPC
    status name of a failed RPC ("UNAVAILABLE"), else None."""

    def __init__(self, msg: str = "", code: str | None = None):
        super().__init__(msg)
        self.code = code


# the stream ends the agent attaches again after (the coordinator went away
# or drains: docs/wire.md, coordinator restart), as zb-worker does; any
# other status is a refusal (a bad binding, a certificate) and final
_AGAIN = {"UNAVAILABLE", "CANCELLED", "UNKNOWN", "INTERNAL", "ABORTED", "DEADLINE_EXCEEDED", "OK"}
# Report statuses that mean "no coordinator now": the report is kept for
# the next one (Agent._send), not a failure
OUTAGE = {"UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED"}


# what the reader thread queues when the stream ends: (None, why)
_CLOSED = object()


def need_grpc() -> None:
    if _IMPORT_ERROR is not None:
        raise AttachError(f"zb.torch.attach needs grpcio and the zb.v1 stubs ({_IMPORT_ERROR}): install "
                          "with pip install './python[torch]' (grpcio-tools present at build time)")


def _channel(address: str, ca: str | None, cert: str | None, key: str | None):
    if not (ca or cert or key):
        return grpc.insecure_channel(address)
    if not (ca and cert and key):
        raise AttachError("ca, cert and key go together (a worker certificate from scripts/make-certs.sh)")

    def read(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise AttachError(f"cannot read {path}: {e.strerror}") from e

    creds = grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=read(key),
                                         certificate_chain=read(cert))
    return grpc.secure_channel(address, creds)


class Link:
    """One agent's connection: Attach stream, heartbeats, Reports."""

    def __init__(self, address: str, request: Any, *, ca=None, cert=None, key=None,
                 heartbeat_s: float = 0.5, rpc_timeout_s: float = 10.0, reattach_s: float = 0.0):
        need_grpc()
        self.pb = zb_pb2
        self.worker_id = request.worker_id
        self.commands: queue.Queue = queue.Queue()
        self._channel = _channel(address, ca, cert, key)
        self._stub = zb_pb2_grpc.ZbStub(self._channel)
        self._rpc_timeout = rpc_timeout_s
        # the configured period, kept apart: each ping's ask is compared
        # with it, not with the last ask (a coordinator that lowers its
        # heartbeat_ms lowers ours again, as zb-worker does)
        self._configured = heartbeat_s
        self._period = heartbeat_s
        self._stop = threading.Event()
        # report() runs on the heartbeat thread and the main thread: the
        # estimate (three fields read together) changes under this lock
        self._clock_lock = threading.Lock()
        self._best_rtt = None
        self._clock = (0.0, 0.0)  # (offset, rtt) of the least-rtt sample
        self._request = request
        # how long the reader tries to attach again after the stream ends
        # (0: never); counted from the loss, reset by the first Command of
        # a new stream
        self._reattach_s = reattach_s
        # (job id, rank) this agent runs: named in a re-attach so that a
        # restarted coordinator gives the rank back (coord_attach_running)
        self.running: tuple[str, int] | None = None
        # bumped by each stream's first Command: the Agent resends its last
        # reports when it sees a new value (the new coordinator may not have
        # counted what the old one took)
        self.epoch = 0
        self.gone = False  # the reader gave up: no more streams
        self.reattaching = False  # the stream is lost and a new one not yet heard from
        self._stream_lock = threading.Lock()  # close() cancels whichever stream is current
        self._stream = self._stub.Attach(request)
        self._reader = threading.Thread(target=self._read, name="zb-attach-reader", daemon=True)
        self._beater = threading.Thread(target=self._beat, name="zb-heartbeat", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        lost_at, backoff = None, 0.1
        while True:
            why, code = self._read_stream()
            if code is None or lost_at is None:
                lost_at, backoff = time.monotonic(), 0.1  # this stream was heard from (or is the first)
            if (self._stop.is_set() or (code is not None and code not in _AGAIN) or
                    time.monotonic() - lost_at + backoff > self._reattach_s):
                break
            # as zb-worker: attach again after a backoff (100 ms doubling
            # to 2 s), naming the running job; the job goes on meanwhile
            self.reattaching = True
            if self._stop.wait(backoff):
                break
            backoff = min(backoff * 2, 2.0)
            req = zb_pb2.AttachRequest()
            req.CopyFrom(self._request)
            if self.running is not None:
                req.running_job_id, req.running_rank = self.running
            with self._stream_lock:
                if self._stop.is_set():
                    break
                self._stream = self._stub.Attach(req)
        if self.reattaching:
            why += f" (not attached again within {self._reattach_s:g} s)"
        self.gone = True
        self.commands.put((_CLOSED, why))

    def _read_stream(self) -> tuple[str, str | None]:
        """Reads the current stream to its end: (why it ended, its status
        name), the name None when it had delivered a Command (then the
        re-attach window starts over)."""
        heard = False
        try:
            for cmd in self._stream:
                if not heard:
                    heard = True
                    if self.reattaching:
                        # another coordinator (or a restarted one): its clock is another
                        with self._clock_lock:
                            self._best_rtt, self._clock = None, (0.0, 0.0)
                    self.reattaching = False
                    self.epoch += 1
                if cmd.WhichOneof("kind") == "ping_unix_ms" and cmd.heartbeat_ms > 0:
                    # the longer of ours and the coordinator's (docs/wire.md, Heartbeats)
                    self._period = max(self._configured, cmd.heartbeat_ms / 1000.0)
                self.commands.put(cmd)
            why, code = "the coordinator ended the Attach stream", "OK"
        except grpc.RpcError as e:
            why, code = f"Attach stream: {e.code().name}: {e.details()}", e.code().name
        except Exception as e:  # anything else ends the stream too: say so, or next_command waits out its wait
            why, code = f"Attach stream reader failed: {type(e).__name__}: {e}", "UNKNOWN"
        return why, (None if heard and code in _AGAIN else code)

    def start_heartbeats(self) -> None:
        self._beater.start()

    def _beat(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self.report(zb_pb2.ReportRequest(worker_id=self.worker_id))
            except AttachError:
                pass  # a lost coordinator shows on the stream; a beat is only a beat

    def next_command(self, timeout: float):
        """The next Command, None on timeout; raises AttachError when the
        stream ended."""
        try:
            item = self.commands.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, tuple) and item[0] is _CLOSED:
            self.commands.put(item)  # every later look sees it too
            raise AttachError(item[1])
        return item

    def report(self, req: Any) -> Any:
        """Sends req (stamped with sent_seconds) and folds the answer's
        times into the clock-offset estimate: the sample of least round
        trip. A failed RPC raises AttachError naming its status."""
        req.sent_seconds = t1 = time.monotonic()
        try:
            resp = self._stub.Report(req, timeout=self._rpc_timeout)
        except grpc.RpcError as e:
            raise AttachError(f"Report to the coordinator: {e.code().name}: {e.details()}", e.code().name) from e
        t4 = time.monotonic()
        if resp.received_seconds and resp.replied_seconds:
            rtt = (t4 - t1) - (resp.replied_seconds - resp.received_seconds)
            offset = ((resp.received_seconds - t1) + (resp.replied_seconds - t4)) / 2
            with self._clock_lock:
                if self._best_rtt is None or rtt < self._best_rtt:
                    self._best_rtt = rtt
                    self._clock = (offset, rtt)
        return resp

    def clock(self) -> tuple[float, float]:
        """(offset, rtt) of the estimate, one consistent pair."""
        with self._clock_lock:
            return self._clock

    @property
    def clock_offset(self) -> float:
        return self.clock()[0]

    @property
    def clock_rtt(self) -> float:
        return self.clock()[1]

    def close(self) -> None:
        """Bounded: each join outlasts one Report's RPC timeout, the
        longest a heartbeat in flight can take to return."""
        self._stop.set()
        with self._stream_lock:
            self._stream.cancel()
        for t in (self._reader, self._beater):
            if t.is_alive():
                t.join(self._rpc_timeout + 5.0)
        self._channel.close()
