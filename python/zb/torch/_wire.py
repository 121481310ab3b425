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


class AttachError(RuntimeError):
    """The agent could not attach, lost the coordinator, or was refused."""


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
                 heartbeat_s: float = 0.5, rpc_timeout_s: float = 10.0):
        need_grpc()
        self.worker_id = request.worker_id
        self.commands: queue.Queue = queue.Queue()
        self._channel = _channel(address, ca, cert, key)
        self._stub = zb_pb2_grpc.ZbStub(self._channel)
        self._rpc_timeout = rpc_timeout_s
        self._period = heartbeat_s
        self._stop = threading.Event()
        self._best_rtt = None
        self.clock_offset = self.clock_rtt = 0.0
        self._stream = self._stub.Attach(request)
        self._reader = threading.Thread(target=self._read, name="zb-attach-reader", daemon=True)
        self._beater = threading.Thread(target=self._beat, name="zb-heartbeat", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for cmd in self._stream:
                if cmd.WhichOneof("kind") == "ping_unix_ms" and cmd.heartbeat_ms > 0:
                    # the longer of ours and the coordinator's (docs/wire.md, Heartbeats)
                    self._period = max(self._period, cmd.heartbeat_ms / 1000.0)
                self.commands.put(cmd)
            why = "the coordinator ended the Attach stream"
        except grpc.RpcError as e:
            why = f"Attach stream: {e.code().name}: {e.details()}"
        self.commands.put((_CLOSED, why))

    def start_heartbeats(self) -> None:
        self._beater.start()

    def _beat(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self.report(zb_pb2.ReportRequest(worker_id=self.worker_id))
            except grpc.RpcError:
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
        times into the clock-offset estimate: the sample of least round trip."""
        req.sent_seconds = t1 = time.monotonic()
        resp = self._stub.Report(req, timeout=self._rpc_timeout)
        t4 = time.monotonic()
        if resp.received_seconds and resp.replied_seconds:
            rtt = (t4 - t1) - (resp.replied_seconds - resp.received_seconds)
            if self._best_rtt is None or rtt < self._best_rtt:
                self._best_rtt = rtt
                self.clock_offset = ((resp.received_seconds - t1) + (resp.replied_seconds - t4)) / 2
                self.clock_rtt = rtt
        return resp

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._stream.cancel()
        for t in (self._reader, self._beater):
            if t.is_alive():
                t.join(timeout)
        self._channel.close()
