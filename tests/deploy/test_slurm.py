#!/usr/bin/env python3
"""deploy/slurm/zb.sbatch on a real single-node Slurm (docs/deploy-slurm.md).

Starts munged, slurmctld and slurmd from Debian 12's packages (munge,
slurmctld, slurmd, slurm-client) as background processes with a fresh
munge key and a minimal slurm.conf in a temporary directory (free ports,
proctrack/linuxproc and task/none: no cgroups, no systemd), the node
advertising two fake GPUs (character devices made in the temporary
directory) so that --gpus-per-task=1 binds one per task. Then:

  1. sbatch --wait zb.sbatch with a sim-backend job on 2 ranks, 2 workers as
     2 tasks on the one node: the batch job exits 0, the zb job SUCCEEDED,
     each worker had its own CUDA_VISIBLE_DEVICES, and nothing is left
     behind (processes, job store, certificates);
  2. a job that needs more ranks than there are workers: refused, the batch
     job exits 1;
  3. scancel while a long job runs: the script's trap stops the workers and
     the coordinator and removes what it made.

Exit status: 0 pass, 1 fail, 77 skip (not root; Slurm or munge not
installed; the daemons cannot start here: their logs' last lines are
printed). Environment: ZB_BIN_DIR (default build/dev of this checkout):
the directory of zb-coordinator, zb-worker and zbctl, flat or a build tree;
or ZB_COORDINATOR_BIN, ZB_WORKER_BIN and ZBCTL_BIN, the three files;
ZB_SLURM_KEEP=1 keeps the temporary directory (=fail: only on failure);
ZB_SLURM_FAKE_GPUS=0 makes no fake GPUs (the path taken where mknod is
refused).
"""

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time

SKIP = 77
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "deploy", "slurm", "zb.sbatch")
START = time.monotonic()
TOTAL_S = 130  # every wait below stays inside this; the teardown's take at most 45 s more


class Skip(Exception):
    pass


class Fail(Exception):
    pass


def left():
    return max(1.0, TOTAL_S - (time.monotonic() - START))


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()[-n:]
    except OSError as e:
        return "  (%s: %s)" % (path, e.strerror)
    return "\n".join("  | " + line for line in lines) or "  (empty)"


def wait_for(what, pred, timeout):
    end = time.monotonic() + min(timeout, left())
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.25)
    return pred()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def find_zb_bin_dir(root):
    """The ZB_BIN given to the script: ZB_BIN_DIR; else a directory of links to
    ZB_COORDINATOR_BIN, ZB_WORKER_BIN and ZBCTL_BIN when all three are set
    (the service tests' variables, set by ctest); else build/dev."""
    files = [os.environ.get(v) for v in ("ZB_COORDINATOR_BIN", "ZB_WORKER_BIN", "ZBCTL_BIN")]
    if not os.environ.get("ZB_BIN_DIR") and all(files):
        d = os.path.join(root, "bin")
        os.makedirs(d)
        for name, f in zip(("zb-coordinator", "zb-worker", "zbctl"), files):
            os.symlink(os.path.abspath(f), os.path.join(d, name))
    else:
        d = os.environ.get("ZB_BIN_DIR") or os.path.join(REPO, "build", "dev")
    for name, sub in (("zb-coordinator", "daemon"), ("zb-worker", "worker"), ("zbctl", "client")):
        if not any(os.access(os.path.join(d, *p), os.X_OK) for p in ((name,), (sub, name))):
            raise Fail("%s not found in %s (nor in %s/%s): build first, or set ZB_BIN_DIR" % (name, d, d, sub))
    return os.path.abspath(d)


class Slurm:
    """munged + slurmctld + slurmd for this host, all under one directory."""

    def __init__(self, root):
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.procs = {}
        self.logs = {}
        self.gpus = 0
        self.cpus = os.cpu_count() or 1
        self.conf = os.path.join(root, "etc", "slurm.conf")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        self.env["SLURM_CONF"] = self.conf

    def path(self, *p):
        return os.path.join(self.root, *p)

    def spawn(self, name, argv):
        log = self.path("log", name + ".out")
        self.logs[name] = log
        with open(log, "wb") as out:
            self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                                env=self.env, start_new_session=True)

    def cmd(self, argv, timeout=15, check=True):
        cp = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=min(timeout, left()))
        if check and cp.returncode != 0:
            raise Fail("%s exited %d: %s" % (" ".join(argv), cp.returncode, cp.stderr.strip()))
        return cp

    def died(self, name):
        rc = self.procs[name].poll()
        if rc is not None:
            raise Skip("%s exited %d at start in this environment; its log:\n%s" % (name, rc, tail(self.logs[name])))

    def start(self):
        for d in ("etc", "munge", "run", "log", "state", "spool", "dev", "node-tmp"):
            os.makedirs(self.path(d))
        os.chmod(self.root, 0o755)  # munged wants its socket's directory reachable by all
        os.chmod(self.path("run"), 0o755)
        os.chmod(self.path("munge"), 0o700)
        self.start_munge()
        self.write_conf()
        self.spawn("slurmctld", ["slurmctld", "-D", "-f", self.conf])
        self.spawn("slurmd", ["slurmd", "-D", "-f", self.conf, "-N", self.host])

        def idle():
            for name in ("slurmctld", "slurmd"):
                self.died(name)
            cp = self.cmd(["sinfo", "-h", "-N", "-o", "%T"], check=False)
            return cp.returncode == 0 and cp.stdout.strip() == "idle"

        if not wait_for("node idle", idle, 30):
            cp = self.cmd(["sinfo", "-N", "-o", "%N %T %E"], check=False)
            raise Skip("the node did not become idle within 30 s (sinfo: %s %s)\nslurmctld:\n%s\nslurmd:\n%s" %
                       (cp.stdout.strip(), cp.stderr.strip(), tail(self.path("log", "slurmctld.log")),
                        tail(self.path("log", "slurmd.log"))))

    def start_munge(self):
        key = self.path("munge", "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(1024))
        os.close(fd)
        self.socket = self.path("run", "munge.socket")
        self.spawn("munged", ["munged", "-F", "--socket=" + self.socket, "--key-file=" + key,
                              "--pid-file=" + self.path("run", "munged.pid"),
                              "--seed-file=" + self.path("munge", "seed"),
                              "--log-file=" + self.path("log", "munged.log"), "--num-threads=10"])

        def works():
            self.died("munged")
            enc = subprocess.run(["munge", "-n", "-S", self.socket], capture_output=True, timeout=5)
            if enc.returncode != 0:
                return False
            dec = subprocess.run(["unmunge", "-S", self.socket], input=enc.stdout, capture_output=True, timeout=5)
            return dec.returncode == 0

        if not wait_for("munged", works, 10):
            raise Skip("munged does not answer on %s; its log:\n%s" % (self.socket, tail(self.logs["munged"])))

    def node_line(self):
        """This host as slurmd sees it (CPUs and topology), named as we name it."""
        line = ""
        try:
            cp = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=10)
            line = cp.stdout.splitlines()[0] if cp.returncode == 0 and cp.stdout else ""
        except (OSError, subprocess.TimeoutExpired):
            pass
        if not line.startswith("NodeName="):
            return "NodeName=%s CPUs=%d RealMemory=1" % (self.host, self.cpus)
        words = [w for w in line.split()[1:] if not w.startswith(("RealMemory=", "UpTime="))]
        m = re.search(r"\bCPUs=(\d+)", line)
        if m:
            self.cpus = int(m.group(1))
        return "NodeName=%s %s RealMemory=1" % (self.host, " ".join(words))

    def fake_gpus(self):
        """Two character devices that gres/gpu accepts as GPUs 0 and 1, so that
        --gpus-per-task=1 sets CUDA_VISIBLE_DEVICES per task. None where
        mknod is refused: the jobs then ask for no GPUs."""
        if os.environ.get("ZB_SLURM_FAKE_GPUS") == "0":
            print("note: ZB_SLURM_FAKE_GPUS=0: no fake GPUs, the jobs run with --gpus-per-task=0")
            return 0
        try:
            for i, minor in enumerate((3, 5)):  # the numbers of /dev/null and /dev/zero
                os.mknod(self.path("dev", "nvidia%d" % i), stat.S_IFCHR | 0o600, os.makedev(1, minor))
        except OSError as e:
            print("note: no fake GPUs (mknod: %s): the jobs run with --gpus-per-task=0" % e.strerror)
            return 0
        with open(self.path("etc", "gres.conf"), "w") as f:
            f.write("NodeName=%s Name=gpu File=%s\n" % (self.host, self.path("dev", "nvidia[0-1]")))
        return 2

    def write_conf(self):
        self.gpus = self.fake_gpus()
        node = self.node_line()
        gres = " Gres=gpu:%d" % self.gpus if self.gpus else ""
        with open(self.conf, "w") as f:
            f.write("""\
ClusterName=zbtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=30
MinJobAge=5
{gres_types}
{node} NodeAddr=127.0.0.1{gres} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""".format(host=self.host, ctld_port=free_port(), d_port=free_port(), socket=self.socket, root=self.root,
                node=node, gres=gres, gres_types="GresTypes=gpu" if self.gpus else ""))

    def queue_empty(self, timeout):
        return wait_for("queue empty", lambda: self.cmd(["squeue", "-h"], check=False).stdout.strip() == "", timeout)

    def stop(self):
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.cmd(["scancel", "--user", "root"], timeout=5, check=False)
                self.queue_empty(10)
            except Exception:
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


def job_yaml(path, name, ranks, iterations, cost, extra=""):
    with open(path, "w") as f:
        f.write("""\
name: {name}
ranks: {ranks}
microbatches: 8
schedule: zb-h1
costs: {{f: {cost}, b: {cost}, w: {cost}, comm: 0}}
iterations: {iterations}
backend: sim
transport: tcp
""".format(name=name, ranks=ranks, iterations=iterations, cost=cost) + extra)
    return path


def leftovers(root, slurm_job):
    """zb processes of this Slurm job still alive: workers by id, the
    coordinator by its data dir (in our node-tmp)."""
    marks = ("--id %s-" % slurm_job, os.path.join(root, "node-tmp", "zb-data-%s" % slurm_job))
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if not argv or not os.path.basename(argv[0].decode(errors="replace")).startswith(("zb-", "zbctl")):
            continue
        text = " ".join(a.decode(errors="replace") for a in argv)
        if any(m in text for m in marks):
            found.append("%s: %s" % (pid, text))
    return found


class Runner:
    def __init__(self, slurm, bin_dir):
        self.s = slurm
        self.env = dict(slurm.env, ZB_BIN=bin_dir, TMPDIR=slurm.path("node-tmp"), ZB_WATCH_EVERY="1",
                        ZB_ATTACH_TIMEOUT_S="30", ZB_MAKE_CERTS=os.path.join(REPO, "scripts", "make-certs.sh"))
        if not shutil.which("openssl"):
            print("note: openssl missing: the jobs run with ZB_TLS=off")
            self.env["ZB_TLS"] = "off"
        self.sbatch = ["sbatch", "--nodes=1", "--ntasks-per-node=2", "--time=5", "--job-name=zb-test",
                       "--output=" + slurm.path("zb-%j.out")]
        if not slurm.gpus:
            self.sbatch.append("--gpus-per-task=0")
        if slurm.cpus < 2:
            self.sbatch.append("--overcommit")

    def out(self, job):
        return self.s.path("zb-%s.out" % job)

    def read_out(self, job):
        try:
            with open(self.out(job), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def run_wait(self, spec, timeout):
        t0 = time.monotonic()
        cp = subprocess.run(self.sbatch + ["--wait", SCRIPT, spec], env=self.env, cwd=self.s.root,
                            capture_output=True, text=True, timeout=min(timeout, left()))
        m = re.search(r"Submitted batch job (\d+)", cp.stdout)
        if not m:
            raise Fail("sbatch did not submit (exit %d): %s %s" % (cp.returncode, cp.stdout, cp.stderr))
        return m.group(1), cp.returncode, time.monotonic() - t0

    def check_cleaned(self, job):
        if not self.s.queue_empty(40):
            raise Fail("Slurm job %s still queued or running" % job)
        procs = wait_for("zb processes gone", lambda: not leftovers(self.s.root, job), 10)
        if not procs:
            raise Fail("processes of Slurm job %s left behind:\n  %s" % (job, "\n  ".join(leftovers(self.s.root, job))))
        run_dir = self.s.path("zb-%s" % job)
        for p in (os.path.join(run_dir, "tls"), self.s.path("node-tmp", "zb-data-%s" % job)):
            if os.path.exists(p):
                raise Fail("%s left behind" % p)


def explain(r, job, why):
    run_dir = r.s.path("zb-%s" % job)
    parts = [why, "sbatch output:", tail(r.out(job), 40)]
    for name in sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else ():
        if name.endswith(".log"):
            parts += [name + ":", tail(os.path.join(run_dir, name))]
    parts += ["slurmd.log:", tail(r.s.path("log", "slurmd.log"), 8)]
    return Fail("\n".join(parts))


def test_job_succeeds(r):
    spec = job_yaml(r.s.path("ok.yaml"), "slurm-ok", 2, 5, 0.002)
    job, rc, secs = r.run_wait(spec, 90)
    text = r.read_out(job)
    m = re.search(r"zb\.sbatch: job (j-\d+) finished: (\w+)", text)
    state = m.group(2) if m else "none printed"
    print("batch job %s: exit %d in %.1f s; zb job %s: %s" % (job, rc, secs, m.group(1) if m else "?", state))
    if rc != 0 or state != "SUCCEEDED":
        raise explain(r, job, "expected exit 0 and SUCCEEDED")
    with open(r.s.path("zb-%s" % job, "job.txt")) as f:
        got = f.read()
    if not re.search(r"^state +SUCCEEDED", got, re.M) or "5/5 iterations" not in got:
        raise explain(r, job, "job.txt (zbctl get) does not say SUCCEEDED, 5/5:\n" + got)
    ids = set(re.findall(r"worker (%s-\d+) on " % job, text + "".join(
        open(os.path.join(r.s.path("zb-%s" % job), n), errors="replace").read()
        for n in os.listdir(r.s.path("zb-%s" % job)) if n.startswith("worker-"))))
    if ids != {"%s-0" % job, "%s-1" % job}:
        raise explain(r, job, "expected workers %s-0 and %s-1, saw %s" % (job, job, sorted(ids)))
    if r.s.gpus:
        logs = [open(os.path.join(r.s.path("zb-%s" % job), "worker-%d.log" % t), errors="replace").read()
                for t in (0, 1)]
        cvd = [re.search(r"--gpu (\d+) CUDA_VISIBLE_DEVICES=(\S+)", log) for log in logs]
        got = [(c.group(1), c.group(2)) if c else None for c in cvd]
        if None in got or {g[0] for g in got} != {"0"} or got[0][1] == got[1][1] or "," in got[0][1] + got[1][1]:
            raise explain(r, job, "expected --gpu 0 and one distinct CUDA_VISIBLE_DEVICES per worker, got %s" % got)
        print("workers bound to CUDA_VISIBLE_DEVICES %s and %s" % (got[0][1], got[1][1]))
    r.check_cleaned(job)


def test_refused_job_fails_the_batch_job(r):
    # an allocation never grows: no waiting for a third worker
    spec = job_yaml(r.s.path("too-big.yaml"), "slurm-too-big", 3, 5, 0.002, "wait_for_workers_s: 0\n")
    job, rc, secs = r.run_wait(spec, 60)
    text = r.read_out(job)
    print("batch job %s (3 ranks, 2 workers): exit %d in %.1f s" % (job, rc, secs))
    if rc != 1 or "zbctl submit" not in text:
        raise explain(r, job, "expected exit 1 after a refused submission")
    r.check_cleaned(job)


def test_scancel_cleans_up(r):
    spec = job_yaml(r.s.path("long.yaml"), "slurm-long", 2, 100000, 0.005)
    cp = subprocess.run(r.sbatch + ["--parsable", SCRIPT, spec], env=r.env, cwd=r.s.root, capture_output=True,
                        text=True, timeout=15)
    if cp.returncode != 0:
        raise Fail("sbatch exited %d: %s" % (cp.returncode, cp.stderr.strip()))
    job = cp.stdout.strip().split(";")[0]

    def iterating():  # once zbctl watch has shown an iteration; None once the job ended
        if re.search(r"iter \d+/100000", r.read_out(job)):
            return True
        return None if r.s.cmd(["squeue", "-h", "-j", job], check=False).stdout.strip() == "" else False

    if not wait_for("job running", lambda: iterating() is not False, 40) or not iterating():
        raise explain(r, job, "the long job did not start iterating within 40 s")
    t0 = time.monotonic()
    r.s.cmd(["scancel", job])
    r.check_cleaned(job)
    text = r.read_out(job)
    print("batch job %s: scancel to all gone in %.1f s" % (job, time.monotonic() - t0))
    if "stopped; logs in" not in text:
        raise explain(r, job, "the script's trap did not run to its end")


def main():
    if os.geteuid() != 0:
        raise Skip("not root: the test runs slurmctld, slurmd and munged as root")
    missing = [p for p in ("munged", "munge", "unmunge", "slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scancel",
                           "scontrol", "srun") if not shutil.which(p)]
    if missing:
        raise Skip("not installed: %s (Debian packages munge, slurmctld, slurmd, slurm-client)" % " ".join(missing))
    host = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(host)
    except OSError:
        raise Skip("this host's name %r does not resolve: the node and the workers are named by it" % host)
    root = tempfile.mkdtemp(prefix="zb-slurm-")
    slurm = Slurm(root)
    ok = False
    try:
        bin_dir = find_zb_bin_dir(root)
        slurm.start()
        print("slurm up on %s in %.1f s (%d CPUs, %d fake GPUs), in %s" %
              (slurm.host, time.monotonic() - START, slurm.cpus, slurm.gpus, root))
        r = Runner(slurm, bin_dir)
        for t in (test_job_succeeds, test_refused_job_fails_the_batch_job, test_scancel_cleans_up):
            t0 = time.monotonic()
            t(r)
            print("ok %s (%.1f s)" % (t.__name__, time.monotonic() - t0))
        ok = True
    finally:
        slurm.stop()
        if os.environ.get("ZB_SLURM_KEEP") == "1" or (not ok and os.environ.get("ZB_SLURM_KEEP") == "fail"):
            print("kept %s" % root)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except Skip as e:
        print("SKIP: %s" % e)
        sys.exit(SKIP)
    except Fail as e:
        print("FAIL: %s" % e)
        sys.exit(1)
    except subprocess.TimeoutExpired as e:
        print("FAIL: timed out: %s" % e)
        sys.exit(1)
    print("PASS (%.1f s)" % (time.monotonic() - START))
    sys.exit(0)
