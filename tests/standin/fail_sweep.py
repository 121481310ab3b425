#!/usr/bin/env python3
"""fail_sweep.py — proves zb checks every CUDA, cuBLAS and kernel-launch
status it is handed (test-only; docs/model.md, The CPU stand-in, Error
injection).

Runs a stand-in test program once listing every call site of an injectable
call (ZB_STANDIN_SITES), keeps the sites in zb's own code (model/, train/,
worker/, found with addr2line) and the kernel launchers, then runs the
program again once per site with that site's call failing
(ZB_STANDIN_FAIL_SITE). Each run must fail (a status that is not checked
lets it pass), not by a signal, within its timeout, with no sanitizer
report, and with an error from zb that names the failing call (the
stand-in's own lines do not count). A site in a destroy or free function
has no caller to report to: there only the signal, timeout and sanitizer
checks apply.

usage: fail_sweep.py BINARY [ARGS...]
"""
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ZB_DIRS = ("/model/", "/train/", "/worker/")
TIMEOUT_S = 120


def sites(binary, args):
    with tempfile.NamedTemporaryFile("r", suffix=".sites") as f:
        env = dict(os.environ, ZB_STANDIN_SITES=f.name)
        r = subprocess.run([binary] + args, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        if r.returncode != 0:
            sys.exit(f"listing run failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        found = sorted({line.split()[0] for line in f.read().splitlines() if line.strip()})
    keep = []
    for s in found:
        api, off = s.split("@")
        if off == "0":  # a launcher or a GEMM: one site per api
            keep.append((s, api, "(launch)"))
            continue
        where = subprocess.run(["addr2line", "-f", "-C", "-i", "-e", binary, hex(int(off, 16) - 1)],
                               capture_output=True, text=True).stdout.split("\n")
        loc = " ".join(w for w in where if w)
        if any(d in loc for d in ZB_DIRS) and "/tests/" not in loc.split(" ")[1]:
            keep.append((s, api, loc))
    return keep


def teardown(loc):
    """A site in a destroy or free function: it has no caller to report to."""
    fn = loc.split(" ")[0]
    return fn.endswith(("_destroy", "_free"))


def run_one(binary, args, site, api, loc):
    env = dict(os.environ, ZB_STANDIN_FAIL_SITE=site)
    env.pop("ZB_STANDIN_SITES", None)
    try:
        r = subprocess.run([binary] + args, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{site} ({loc}): hung past {TIMEOUT_S} s"
    out = r.stdout + r.stderr
    fired = "injected failure: " + api in out
    if not fired:
        return None  # the site was not reached this time (timing): nothing to judge
    if r.returncode < 0:
        return f"{site} ({loc}): died of signal {-r.returncode}"
    if any(s in out for s in ("AddressSanitizer", "LeakSanitizer", "runtime error:")):
        return f"{site} ({loc}): sanitizer report"
    if r.returncode == 0 and not teardown(loc):
        return f"{site} ({loc}): the program passed: the failure went unchecked"
    if teardown(loc):
        return None  # nothing to return an error to: not crashing and not leaking is the test
    ours = [l for l in out.splitlines() if not l.startswith(("cuda stand-in:", "nccl stand-in:"))]
    if not any(api in l for l in ours):
        return f"{site} ({loc}): zb's error does not name {api}:\n  " + "\n  ".join(ours[-6:])
    return None


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary, args = sys.argv[1], sys.argv[2:]
    todo = sites(binary, args)
    print(f"{len(todo)} call sites in zb's code")
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda t: run_one(binary, args, *t), todo))
    bad = [r for r in results if r]
    for (site, api, loc), r in zip(todo, results):
        mark = "FAIL " if r else "ok   " if not teardown(loc) else "ok*  "
        print(mark + f"{site:40} {loc}")
    print("ok*: teardown, judged for crashes, hangs and sanitizer reports only")
    for r in bad:
        print("FAIL:", r)
    sys.exit(1 if bad or not todo else 0)


if __name__ == "__main__":
    main()
