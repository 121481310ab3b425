"""No acknowledged job lost on a full disk (issue 13, Durability): the
coordinator's data_dir on a small tmpfs that the test fills. While the
store takes no writes, submissions are refused with UNAVAILABLE and
Health answers NOT_SERVING; every job that was acknowledged survives a
restart; when space returns the coordinator serves again; job ids never
repeat. Needs mount(8) with tmpfs (root in CI); skipped with the reason
otherwise."""

import os
import subprocess
import sys
import tempfile
import time

import zbsvc
from zbsvc import STATE, Cluster, health_pb2, job_spec, rpc_error, zb_pb2

import grpc


def mount_tmpfs(path, size):
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "tmpfs", path], capture_output=True,
                        text=True)
    return cp.returncode == 0, cp.stderr.strip()


def fill(path):
    """Writes a file until the filesystem is full; returns its path."""
    filler = os.path.join(path, "filler")
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def test_full_disk_loses_no_acknowledged_job():
    base = tempfile.mkdtemp(prefix="zb-disk-")
    data = os.path.join(base, "data")
    os.mkdir(data)
    ok, why = mount_tmpfs(data, "4m")
    if not ok:
        print("skipped: cannot mount a tmpfs for the data_dir (%s)" % why)
        sys.exit(77)
    try:
        with Cluster(workers=2, name="disk", data_dir=data) as c:
            acked = [c.submit(job_spec(name="before", ranks=2, microbatches=4, iterations=1))]
            c.wait_state(acked[0], STATE.JOB_STATE_SUCCEEDED)
            filler = fill(data)
            refused = 0
            for k in range(30):
                try:
                    acked.append(c.submit(job_spec(name="full-%d" % k, ranks=2, microbatches=4, iterations=1)))
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE, (e.code(), e.details())
                    refused += 1
                    last = e.details()
            print("disk full: %d acknowledged, %d refused (%s)" % (len(acked) - 1, refused, last[:100]))
            assert refused > 0, "the full disk refused nothing"
            assert c.health() == health_pb2.HealthCheckResponse.NOT_SERVING
            # acknowledged while full: each is in the store (seen after a restart)
            os.unlink(filler)
            zbsvc.wait_until("SERVING again once space returns",
                             lambda: c.health() == health_pb2.HealthCheckResponse.SERVING, 10)
            after = c.submit(job_spec(name="after", ranks=2, microbatches=4, iterations=1))
            acked.append(after)
            c.wait_state(after, STATE.JOB_STATE_SUCCEEDED)
            c.coordinator.signal(zbsvc.signal.SIGTERM)
            assert c.coordinator.wait(30) == 0
            c.start_coordinator(port=c.port)
            c.wait_workers(2, timeout=30)
            have = {j.id for j in c.list_jobs()}
            lost = [j for j in acked if j not in have]
            assert not lost, "acknowledged but lost: %s" % lost
            numbers = [int(j.split("-")[1]) for j in acked]
            assert len(set(numbers)) == len(numbers), numbers
            new = c.submit(job_spec(name="new", ranks=2, microbatches=4, iterations=1))
            assert int(new.split("-")[1]) > max(numbers), (new, numbers)
            print("after a restart: all %d acknowledged jobs present; next id %s" % (len(acked), new))
            c.assert_serving()
    finally:
        subprocess.run(["umount", data], capture_output=True)
        zbsvc.shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
