#!/usr/bin/env python3
"""bench_py_plan.py — planning from Python: in-process through the zb
package (python/) against a `zbctl plan` subprocess, measured in one run.

    PYTHON bench/bench_py_plan.py ZBCTL [--schedule zb-v --ranks 8 --microbatches 16]

PYTHON is an interpreter with the package installed (python/README.md;
ctest's python_plan leaves one in build/dev/venv-py). Prints, for the
shape given (default zb-v p=8 m=16):
  first call   zb.plan in a fresh interpreter, import included (median
               over fresh interpreters; interpreter start-up excluded)
  steady       the median of later zb.plan calls in one interpreter, and
               of zb.plan with its actions, figures and csv_comm() read
  zbctl        the median of `zbctl plan -o json` subprocesses
and the ratios of zbctl's time to the package's. The targets of issue 32
are < 5 ms first call and < 1 ms steady.
"""
import argparse
import statistics
import subprocess
import sys
import time

FIRST_CALL = """
import time
t0 = time.perf_counter()
import zb
zb.plan({schedule!r}, {ranks}, {microbatches})
print(time.perf_counter() - t0)
"""


def first_call(a, runs):
    code = FIRST_CALL.format(schedule=a.schedule, ranks=a.ranks, microbatches=a.microbatches)
    out = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                text=True).stdout) for _ in range(runs)]
    return statistics.median(out)


def median_time(fn, runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("zbctl")
    ap.add_argument("--schedule", default="zb-v")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=16)
    ap.add_argument("--runs", type=int, default=200, help="steady calls (zbctl: runs / 4, first call: runs / 10)")
    a = ap.parse_args()
    import zb

    shape = (a.schedule, a.ranks, a.microbatches)
    zb.plan(*shape)  # warm: caches, the allocator's pools

    def full():
        p = zb.plan(*shape)
        return p.actions, p.compute_actions, p.figures, p.csv_comm()

    cmd = [a.zbctl, "plan", "--schedule", a.schedule, "--ranks", str(a.ranks), "--microbatches",
           str(a.microbatches), "-o", "json"]
    first = first_call(a, max(5, a.runs // 10))
    steady = median_time(lambda: zb.plan(*shape), a.runs)
    steady_full = median_time(full, a.runs)
    proc = median_time(lambda: subprocess.run(cmd, check=True, capture_output=True), max(10, a.runs // 4))
    print(f"{a.schedule} p={a.ranks} m={a.microbatches}  (medians; Python {sys.version.split()[0]})")
    print(f"  zb.plan first call, import included   {first * 1e3:8.3f} ms  (target < 5 ms)")
    print(f"  zb.plan steady                        {steady * 1e3:8.3f} ms  (target < 1 ms)")
    print(f"  zb.plan + actions, figures, csv_comm  {steady_full * 1e3:8.3f} ms")
    print(f"  zbctl plan -o json subprocess         {proc * 1e3:8.3f} ms")
    print(f"  zbctl / zb.plan: {proc / steady:.1f}x steady, {proc / first:.1f}x first call")


if __name__ == "__main__":
    main()
