"""The systemd units of deploy/systemd (issue 14, systemd), checked with the
real tools as far as a machine without systemd as PID 1 allows:
`systemd-analyze verify` clean (and shown to catch a bad key),
`systemd-analyze security --offline=true` exposure within 2.0 for the
coordinator and 3.5 for the worker, every Documentation= man page present,
and the coordinator run under an approximation of its sandbox: an
unprivileged user with no capabilities and no new privileges, a read-only
root with only its state directory writable, umask 077 and the soft
open-files limit of 1024 it raises to the unit's LimitNOFILE, reporting
READY=1 on $NOTIFY_SOCKET and answering health checks. What this cannot
check: the seccomp filter, PrivateUsers/PrivateDevices/ProtectKernel*,
DynamicUser and StateDirectory creation (they need systemd itself)."""

import os
import re
import resource
import shutil
import socket
import subprocess
import tempfile
import time

import zbsvc
from zbsvc import health_pb2

import grpc

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
UNITS = os.path.join(ROOT, "deploy", "systemd")
MAN = os.path.join(ROOT, "docs", "man")
EXPOSURE = {"zb-coordinator.service": 2.0, "zb-worker@.service": 3.5}


def analyze(*args, cwd=None):
    return subprocess.run(["systemd-analyze"] + list(args), capture_output=True, text=True, cwd=cwd, timeout=60)


def local_units(d):
    """The units with ExecStart pointing at the binaries under test
    (verify insists they exist)."""
    for name in EXPOSURE:
        with open(os.path.join(UNITS, name)) as f:
            text = f.read()
        text = text.replace("/usr/bin/zb-coordinator", zbsvc.COORDINATOR).replace("/usr/bin/zb-worker", zbsvc.WORKER)
        with open(os.path.join(d, name), "w") as f:
            f.write(text)


def verify(d, unit):
    cp = analyze("verify", "--man=no", "./" + unit, cwd=d)
    return cp.returncode, (cp.stdout + cp.stderr).strip()


def test_units_verify_clean():
    if not shutil.which("systemd-analyze"):
        print("SKIP: systemd-analyze not installed")
        return
    with tempfile.TemporaryDirectory(prefix="zb-units-") as d:
        local_units(d)
        for unit in ["zb-coordinator.service", "zb-worker@0.service"]:
            rc, out = verify(d, unit)
            print("verify %s: rc %d%s" % (unit, rc, (": " + out) if out else ", no findings"))
            assert rc == 0 and not out, out
        with open(os.path.join(d, "zb-coordinator.service"), "a") as f:
            f.write("\n[Service]\nWatchdogSecs=3\n")  # a misspelt key is reported
        rc, out = verify(d, "zb-coordinator.service")
        assert "Unknown key" in out and "WatchdogSecs" in out, (rc, out)


def test_units_exposure_within_bounds():
    if not shutil.which("systemd-analyze"):
        print("SKIP: systemd-analyze not installed")
        return
    for unit, bound in EXPOSURE.items():
        cp = analyze("security", "--offline=true", os.path.join(UNITS, unit))
        m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", cp.stdout + cp.stderr)
        assert m, cp.stdout + cp.stderr
        print("%s: exposure %s (bound %.1f)" % (unit, m.group(1), bound))
        assert float(m.group(1)) <= bound, (unit, m.group(1))


def test_documentation_pages_exist():
    for unit in EXPOSURE:
        with open(os.path.join(UNITS, unit)) as f:
            pages = re.findall(r"man:([\w.-]+)\((\d)\)", f.read())
        assert pages, unit
        for name, section in pages:
            path = os.path.join(MAN, "%s.%s" % (name, section))
            assert os.path.isfile(path), "%s names man:%s(%s), which %s does not hold" % (unit, name, section, MAN)


def wait_ready(sock, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        sock.settimeout(max(0.1, end - time.monotonic()))
        try:
            msg = sock.recv(4096).decode()
        except socket.timeout:
            break
        if "READY=1" in msg.split("\n"):
            return msg
    raise AssertionError("no READY=1 within %.0f s" % timeout)


def test_coordinator_runs_under_its_sandbox():
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        print("SKIP: needs root, unshare and setpriv to drop to an unprivileged user on a read-only root")
        return
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
    d = tempfile.mkdtemp(prefix="zb-sandbox-")
    data = os.path.join(d, "state")
    os.makedirs(data)
    os.chown(data, 65534, 65534)
    os.chmod(d, 0o755)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(os.path.join(d, "notify.sock"))
    os.chmod(os.path.join(d, "notify.sock"), 0o777)
    ports = os.path.join(data, "ports")
    inner = ("mount --bind {data} {data} && mount --bind / / && mount -o remount,bind,ro / && umask 077 && "
             "exec prlimit --nofile=1024:{limit} -- setpriv --reuid=65534 --regid=65534 --clear-groups "
             "--no-new-privs --inh-caps=-all --bounding-set=-all -- {bin} --listen 127.0.0.1:0 "
             "--metrics-listen 127.0.0.1:0 --data-dir {data} --port-file {ports}").format(
                 data=data, limit=limit, bin=zbsvc.COORDINATOR, ports=ports)
    log = open(os.path.join(d, "coordinator.log"), "w+")
    p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", inner],
                         stdout=log, stderr=subprocess.STDOUT,
                         env=dict(os.environ, NOTIFY_SOCKET=os.path.join(d, "notify.sock")))
    try:
        ready = wait_ready(sock, 15 * zbsvc.SLOW)
        with open(ports) as f:
            port = int(f.read().split()[0])
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                               response_deserializer=health_pb2.HealthCheckResponse.FromString)
        status = check(health_pb2.HealthCheckRequest(), timeout=10).status
        ch.close()
        st = os.stat(os.path.join(data, "zb.db"))
        log.seek(0)
        text = log.read()
        print("sandboxed: %s; health %s; zb.db uid %d mode %o" %
              (ready.replace("\n", " "), health_pb2.HealthCheckResponse.ServingStatus.Name(status), st.st_uid,
               st.st_mode & 0o777))
        assert status == health_pb2.HealthCheckResponse.SERVING
        assert st.st_uid == 65534 and st.st_mode & 0o077 == 0, (st.st_uid, oct(st.st_mode))
        assert "open-files limit %d (was 1024)" % limit in text, text
    finally:
        p.terminate()
        rc = p.wait(30)
        sock.close()
        log.close()
        shutil.rmtree(d, ignore_errors=True)
    assert rc == 0, rc


if __name__ == "__main__":
    zbsvc.run_tests(globals())
