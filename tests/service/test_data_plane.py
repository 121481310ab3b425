"""The data plane's frame MACs against a relay on the path (docs/model.md,
Transports; docs/operations.md, Security): a real cpu job on two zb-workers
with the tcp transport, each worker listening on 127.0.0.1 and advertising
127.0.0.2 (--advertise-address), where a relay in this test forwards its
port to the worker's real one, so every data connection runs through a
relay. Forwarding unchanged, the job SUCCEEDS (the relays are
transparent, and they did carry the connection); when the relay flips one
bit of the first frame rank 0 sends after the handshake, the job FAILS
with a reason naming the frame, rank 0 and its address and the MAC."""

import socket
import threading

import zbsvc
from zbsvc import STATE, Cluster, zb_pb2

RELAY_HOST = "127.0.0.2"  # loopback too; a worker listens on 127.0.0.1
HANDSHAKE = 2 * 72  # the dialer's hello and proof (worker/transport_tcp.h)
FRAME_HEADER = 40


class Relay:
    """Listens on (RELAY_HOST, port) and forwards each connection to
    (127.0.0.1, port). With flip_at set when a connection arrives, the byte
    at that offset of what the dialing side sends on it is XORed with 1."""

    def __init__(self, port):
        self.upstream = ("127.0.0.1", port)
        self.flip_at = None
        self.connections = 0
        self.flipped = 0
        self.lock = threading.Lock()
        self.socks = []
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((RELAY_HOST, port))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stopping:
            try:
                dialer, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            dialer.settimeout(None)
            try:
                acceptor = socket.create_connection(self.upstream, timeout=10 * zbsvc.SLOW)
            except OSError:
                dialer.close()
                continue
            acceptor.settimeout(None)
            with self.lock:
                self.connections += 1
                self.socks += [dialer, acceptor]
                flip_at = self.flip_at
            for src, dst, at in ((dialer, acceptor, flip_at), (acceptor, dialer, None)):
                threading.Thread(target=self._pump, args=(src, dst, at), daemon=True).start()

    def _pump(self, src, dst, flip_at):
        offset = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if flip_at is not None and offset <= flip_at < offset + len(data):
                    changed = bytearray(data)
                    changed[flip_at - offset] ^= 0x01
                    data = bytes(changed)
                    with self.lock:
                        self.flipped += 1
                offset += len(data)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):  # either end closing closes the other, as without a relay
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.stopping = True
        self.thread.join(5)
        self.listener.close()
        with self.lock:
            for s in self.socks:
                s.close()


def relayed_workers(k):
    return ["--listen", "127.0.0.1:0", "--advertise-address", RELAY_HOST]


def cpu_job(name):
    m = zb_pb2.ModelSpec(hidden=16, heads=2, layers=2, seq_len=8, batch=2, seed=3)
    return zb_pb2.JobSpec(name=name, ranks=2, microbatches=2, schedule="1f1b", iterations=3, backend="cpu",
                          model=m)


def start_relays(c):
    relays = []
    for w in c.list_workers():
        host, port = w.data_address.rsplit(":", 1)
        assert host == RELAY_HOST, w.data_address
        relays.append(Relay(int(port)))
    return relays


def test_relay_flipping_a_bit_fails_the_job():
    with Cluster(workers=2, worker_args=relayed_workers, name="data-mac") as c:
        relays = start_relays(c)
        try:
            clean = c.submit(cpu_job("through-relay"))
            job = c.wait_state(clean, STATE.JOB_STATE_SUCCEEDED, timeout=120)
            carried = sum(r.connections for r in relays)
            print("unchanged relay: %s, %d iterations, %d relayed connection(s)" %
                  (zbsvc.state_name(job.state), job.iterations_done, carried))
            assert job.iterations_done == 3 and carried >= 1, (job, carried)

            c.wait_workers(2)
            rank0 = [w.data_address for w in c.list_workers()]  # the job's rank 0 is one of them
            for r in relays:
                r.flip_at = HANDSHAKE + FRAME_HEADER + 4  # inside rank 0's first frame, after the handshake
            bad = c.submit(cpu_job("bit-flipped"))
            job = c.wait_state(bad, STATE.JOB_STATE_FAILED, timeout=120)
            print("relay flipping a bit: %s: %s" % (zbsvc.state_name(job.state), job.reason))
            assert sum(r.flipped for r in relays) == 1, [r.flipped for r in relays]
            assert "frame 0 from rank 0 (" in job.reason and "failed its" in job.reason, job.reason
            assert "MAC: the data plane was changed in transit" in job.reason, job.reason
            assert any("rank 0 (%s)" % a in job.reason for a in rank0), (job.reason, rank0)
            assert job.reason.startswith("rank 1 "), job.reason  # the receiver names it, not a symptom
            c.assert_serving()
        finally:
            for r in relays:
                r.close()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
