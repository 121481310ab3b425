"""The daemons under systemd (issue 14, systemd): the sd_notify protocol as
a service manager sees it, on a datagram socket this test owns: READY=1
once serving, WATCHDOG=1 keep-alives at twice the rate WATCHDOG_USEC asks
that stop while the coordinator's loop is stopped, RELOADING=1 then READY=1
around SIGHUP, STOPPING=1 on SIGTERM; the worker the same, with its
attachment in STATUS. A worker whose coordinator is unreachable says so.
The units themselves: test_systemd_units.py."""

import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time

import zbsvc
from zbsvc import Cluster

WATCHDOG_USEC = 400000  # keep-alives every 200 ms


class Notifications:
    """What $NOTIFY_SOCKET receives, as (arrival time, {key: value}), read
    as it comes by a thread, as a service manager does (a reader that falls
    behind fills the socket: the daemons then drop messages, never block)."""

    def __init__(self, d):
        self.path = os.path.join(d, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.got, self.lock, self.done = [], threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while not self.done.is_set():
            try:
                data = self.sock.recv(4096).decode()
            except socket.timeout:
                continue
            fields = dict(line.split("=", 1) for line in data.split("\n") if "=" in line)
            with self.lock:
                self.got.append((time.monotonic(), fields))

    def close(self):
        self.done.set()
        self.thread.join(5)
        self.sock.close()

    def seen(self):
        with self.lock:
            return list(self.got)

    def wait_for(self, key, value=None, timeout=10, since=0):
        end = time.monotonic() + timeout * zbsvc.SLOW
        while time.monotonic() < end:
            for at, f in self.seen():
                if at >= since and key in f and (value is None or f[key].startswith(value)):
                    return at, f
            time.sleep(0.05)
        raise AssertionError("no %s=%s in %s" % (key, value, [f for _, f in self.seen()]))

    def count(self, key, start, end):
        return sum(1 for at, f in self.seen() if start <= at < end and key in f)


def notify_env(n):
    return {"NOTIFY_SOCKET": n.path, "WATCHDOG_USEC": str(WATCHDOG_USEC)}


def test_coordinator_notifies_the_service_manager():
    with tempfile.TemporaryDirectory(prefix="zbsvc-notify-") as d:
        n = Notifications(d)
        config = os.path.join(d, "zb.yaml")
        with open(config, "w") as f:
            f.write("log_level: info\n")
        saved = dict(os.environ)
        os.environ.update(notify_env(n))  # the coordinator inherits it; the workers below do not
        try:
            c = Cluster(workers=0, name="notify", coordinator_args=["--config", config]).__enter__()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        try:
            _, ready = n.wait_for("READY", "1")
            print("READY: %s" % ready)
            assert ready.get("STATUS", "").startswith("serving"), ready
            t0 = time.monotonic()
            time.sleep(2.0)
            beats = n.count("WATCHDOG", t0, t0 + 2.0)
            print("%d keep-alives in 2 s (WATCHDOG_USEC %d)" % (beats, WATCHDOG_USEC))
            assert beats >= 5, n.seen()[-5:]
            c.coordinator.signal(signal.SIGSTOP)  # a hung loop sends none
            t1 = time.monotonic()
            time.sleep(1.5)
            stopped = n.count("WATCHDOG", t1 + 0.3, t1 + 1.5)
            c.coordinator.signal(signal.SIGCONT)
            print("%d keep-alives while the coordinator was stopped" % stopped)
            assert stopped == 0, stopped
            n.wait_for("WATCHDOG", "1", since=time.monotonic())
            t2 = time.monotonic()
            c.coordinator.signal(signal.SIGHUP)
            at_reload, _ = n.wait_for("RELOADING", "1", since=t2)
            at_ready, _ = n.wait_for("READY", "1", since=at_reload)
            c.assert_serving()
            t3 = time.monotonic()
            c.coordinator.stop()
            n.wait_for("STOPPING", "1", since=t3)
        finally:
            c.__exit__(None, None, None)
            n.close()


def test_worker_notifies_and_says_when_it_cannot_attach():
    with tempfile.TemporaryDirectory(prefix="zbsvc-notify-") as d, Cluster(workers=0, name="notify-w") as c:
        n = Notifications(d)
        c.start_worker("nw", env=notify_env(n))
        _, ready = n.wait_for("READY", "1")
        _, attached = n.wait_for("STATUS", "attached to")
        print("worker: %s; %s" % (ready, attached))
        t0 = time.monotonic()
        time.sleep(1.0)
        assert n.count("WATCHDOG", t0, t0 + 1.0) >= 2, n.seen()[-5:]
        # a worker sent to a port nobody serves logs why it is not attached
        dead = socket.socket()
        dead.bind(("127.0.0.1", 0))
        port = dead.getsockname()[1]
        dead.close()
        lost = c.start_worker("lost", port=port)
        zbsvc.wait_until("the unattached warning", lambda: "not attached to" in lost.log_text(), 15)
        c.workers["nw"].stop()
        n.wait_for("STOPPING", "1", since=t0)
        n.close()
        # a service manager that stops reading fills the socket: the worker
        # drops its keep-alives and still stops on SIGTERM (a blocking send
        # once held it until SIGKILL)
        deaf = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        deaf.bind(os.path.join(d, "deaf.sock"))
        stuck = c.start_worker("deaf", env={"NOTIFY_SOCKET": os.path.join(d, "deaf.sock"), "WATCHDOG_USEC": "20000"})
        time.sleep(2)
        rc, clean = stuck.stop()
        deaf.close()
        assert clean and rc == 0, (rc, clean)
        c.assert_serving()


LOGFMT = re.compile(r'^(?:ts=\S+Z |<[0-7]>)level=(debug|info|warn|error) src="[^"]*" msg="(?:[^"\\]|\\.)*"$')


def second_coordinator(c, d, name, env=None):
    """A second coordinator on the cluster's taken port: it fails to
    listen, which gRPC itself logs; returns its stderr lines."""
    path = os.path.join(d, name + ".log")
    with open(path, "w") as err:
        st = os.fstat(err.fileno())
        extra = {"JOURNAL_STREAM": "%d:%d" % (st.st_dev, st.st_ino)} if env == "journal" else {}
        cp = subprocess.run([zbsvc.COORDINATOR, "--listen", "127.0.0.1:%d" % c.port, "--metrics-listen",
                             "127.0.0.1:0", "--data-dir", os.path.join(d, name)], stdout=subprocess.DEVNULL,
                            stderr=err, env=dict(os.environ, **extra), timeout=30)
    assert cp.returncode == 1, cp.returncode
    with open(path) as f:
        return f.read().splitlines()


def test_logs_are_logfmt_with_grpc_lines_and_journal_priorities():
    """Every line, zb's and gRPC's, is one logfmt record; when stderr is the
    journal ($JOURNAL_STREAM names it) each starts with its syslog priority
    instead of a timestamp, so `journalctl -p err` finds the errors."""
    with tempfile.TemporaryDirectory(prefix="zbsvc-logs-") as d, Cluster(workers=1, name="logs") as c:
        lines = second_coordinator(c, d, "plain")
        bad = [l for l in lines if not LOGFMT.match(l)]
        assert not bad, bad
        assert any(' src="grpc" ' in l and "level=error" in l for l in lines), lines
        assert any(l.startswith("ts=") and 'src="coordinator"' in l for l in lines), lines
        for p in c.procs:  # the cluster's own logs too (past the start banner)
            body = [l for l in p.log_text().splitlines() if not l.startswith("=== start:")]
            assert all(LOGFMT.match(l) for l in body), [l for l in body if not LOGFMT.match(l)][:3]
        journal = second_coordinator(c, d, "journal", env="journal")
        print("journal lines: %s" % journal[:2])
        assert journal and all(LOGFMT.match(l) and l.startswith("<") for l in journal), journal
        assert any(l.startswith("<6>level=info") for l in journal), journal
        assert any(l.startswith("<3>level=error") and 'src="coordinator"' in l for l in journal), journal


if __name__ == "__main__":
    zbsvc.run_tests(globals())
