"""Install and package (issue 14, Install): `cmake --install` into a staging
root puts the binaries, units, config examples, man pages and completion
where Debian looks for them; the .deb that CPack makes holds the same,
marks the configs as conffiles, depends on the Debian package of every
library the binaries link (other than the CUDA toolkit's, recommended),
and dpkg installs it (into a root of its own) with a coordinator that runs;
zbctl's completion offers every flag each command's --help names."""

import os
import re
import shutil
import subprocess
import tempfile

import zbsvc

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.dirname(os.path.dirname(zbsvc.COORDINATOR))  # build/PRESET
EXPECTED = ["usr/bin/zb-coordinator", "usr/bin/zb-worker", "usr/bin/zbctl",
            "usr/lib/systemd/system/zb-coordinator.service", "usr/lib/systemd/system/zb-worker@.service",
            "etc/zb/zb-coordinator.yaml", "etc/zb/zb-worker.env", "usr/share/man/man1/zbctl.1",
            "usr/share/man/man8/zb-coordinator.8", "usr/share/man/man8/zb-worker.8",
            "usr/share/bash-completion/completions/zbctl", "usr/share/doc/zb/examples/jobs/local-train.yaml",
            "usr/share/doc/zb/examples/models/llama-tiny/config.json"]
COMMANDS = ["plan", "plan compare", "submit", "list", "get", "watch", "cancel", "resume", "update-schedule",
            "trace", "workers"]


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)


def test_install_into_a_staging_root():
    with tempfile.TemporaryDirectory(prefix="zb-stage-") as d:
        cp = run(["cmake", "--install", BUILD, "--prefix", "/usr"], env=dict(os.environ, DESTDIR=d))
        assert cp.returncode == 0, cp.stdout + cp.stderr
        for rel in EXPECTED:
            assert os.path.isfile(os.path.join(d, rel)), "not installed: /" + rel
        with open(os.path.join(ROOT, "deploy/systemd/zb-coordinator.service")) as a, \
                open(os.path.join(d, "usr/lib/systemd/system/zb-coordinator.service")) as b:
            assert a.read() == b.read()
        cp = run([os.path.join(d, "usr/bin/zb-coordinator"), "--version"])
        assert cp.returncode == 0 and cp.stdout.startswith("zb-coordinator "), cp.stdout + cp.stderr
        print("installed %d files under a staging root; the installed coordinator says %s" %
              (sum(len(f) for _, _, f in os.walk(d)), cp.stdout.strip()))


def direct_packages(binary):
    """Debian packages of the libraries a binary names itself (NEEDED; theirs
    bring their own dependencies), and those of them no package holds (the
    CUDA toolkit's)."""
    names = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", run(["readelf", "-d", binary]).stdout))
    pkgs, loose = set(), set()
    for line in run(["ldd", binary]).stdout.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if not m or m.group(1) not in names:
            continue
        cp = run(["dpkg", "-S", os.path.realpath(m.group(2))])
        cp = cp if cp.returncode == 0 else run(["dpkg", "-S", m.group(2)])
        if cp.returncode == 0:
            pkgs.add(cp.stdout.split(":")[0])
        else:
            loose.add(m.group(1))
    return pkgs, loose


def test_deb_package():
    if not shutil.which("cpack") or not shutil.which("dpkg-deb"):
        print("SKIP: cpack or dpkg-deb missing")
        return
    with tempfile.TemporaryDirectory(prefix="zb-deb-") as d:
        cp = run(["cpack", "-G", "DEB", "-B", d], cwd=BUILD)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        deb = [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".deb")]
        assert len(deb) == 1, os.listdir(d)
        files = {line.split()[-1].lstrip("./") for line in run(["dpkg-deb", "-c", deb[0]]).stdout.splitlines()}
        for rel in EXPECTED:
            assert rel in files, "not in the .deb: /" + rel
        fields = run(["dpkg-deb", "-f", deb[0], "Depends", "Recommends"]).stdout
        control = os.path.join(d, "control")
        run(["dpkg-deb", "-e", deb[0], control])
        with open(os.path.join(control, "conffiles")) as f:
            assert f.read().split() == ["/etc/zb/zb-coordinator.yaml", "/etc/zb/zb-worker.env"]
        depends = set(re.findall(r"[a-z0-9][a-z0-9.+-]+", fields.split("\n")[0]))
        for b in [zbsvc.COORDINATOR, zbsvc.WORKER, zbsvc.ZBCTL]:
            if zbsvc.SANITIZE:  # a sanitizer build links gRPC's own libraries directly too: not a product
                print("Depends not checked against the ASan build's libraries")
                break
            pkgs, loose = direct_packages(b)
            # the C++ runtime comes with libgrpc29; the sanitizer runtimes only in the ASan build
            missing = pkgs - depends - {"libgcc-s1", "libstdc++6", "libasan8", "libubsan1"}
            assert not missing, "%s links %s, which Depends lacks (%s)" % (os.path.basename(b), missing, fields)
            assert all(re.match(r"lib(cudart|cublas|cublasLt|nccl)\.", lib) for lib in loose), loose
        print("%s: %d files, %s" % (os.path.basename(deb[0]), len(files), fields.replace("\n", "; ")))
        install_deb(deb[0], d)


def install_deb(deb, d):
    """dpkg installs the package into a root of its own (its database there,
    so the host's is untouched; the libraries it depends on are the host's,
    hence --force-depends), and the installed coordinator runs."""
    if os.geteuid() != 0 or not shutil.which("dpkg"):
        print("SKIP: installing the .deb needs root and dpkg")
        return
    root = os.path.join(d, "root")
    for sub in ("var/lib/dpkg/info", "var/lib/dpkg/updates"):
        os.makedirs(os.path.join(root, sub))
    open(os.path.join(root, "var/lib/dpkg/status"), "w").close()
    cp = run(["dpkg", "--root=" + root, "--force-depends", "--force-script-chrootless", "-i", deb])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    status = run(["dpkg", "--root=" + root, "-s", "zb"]).stdout
    assert "Status: install ok installed" in status, status
    cp = run([os.path.join(root, "usr/bin/zb-coordinator"), "--version"])
    assert cp.returncode == 0 and cp.stdout.startswith("zb-coordinator "), cp.stdout + cp.stderr
    print("dpkg installed it; its zb-coordinator --version: %s" % cp.stdout.strip())


def test_completion_offers_every_flag():
    script = os.path.join(ROOT, "deploy/completion/zbctl.bash")
    for command in COMMANDS:
        helptext = run([zbsvc.ZBCTL] + command.split() + ["--help"])
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", helptext.stdout + helptext.stderr))
        words = ["zbctl"] + command.split() + ["--"]
        probe = ("source %s; COMP_WORDS=(%s); COMP_CWORD=%d; _zbctl; printf '%%s\\n' \"${COMPREPLY[@]}\"" %
                 (script, " ".join(words), len(words) - 1))
        offered = set(run(["bash", "-c", probe]).stdout.split())
        assert flags <= offered, "zbctl %s: --help names %s, completion lacks them" % (command, flags - offered)
    top = run(["bash", "-c", "source %s; COMP_WORDS=(zbctl ''); COMP_CWORD=1; _zbctl; echo ${COMPREPLY[@]}" %
               script]).stdout.split()
    assert set(c.split()[0] for c in COMMANDS) <= set(top), top


if __name__ == "__main__":
    zbsvc.run_tests(globals())
