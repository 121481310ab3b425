"""Test-only stand-in for zb.plan(): runs zbctl and exposes the duck-typed
plan zb.torch needs (placement as a stage -> rank list, chunks, ranks,
microbatches, csv_comm(), csv(), figures). Exits 77 (ctest skip) where
zbctl or torch is missing."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "python"))


def need_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIP: torch is not importable by", sys.executable)
        sys.exit(77)


def zbctl_path():
    path = os.environ.get("ZBCTL_BIN", os.path.join(SRC, "build", "dev", "client", "zbctl"))
    if not os.access(path, os.X_OK):
        print("SKIP: no zbctl at", path, "(set ZBCTL_BIN)")
        sys.exit(77)
    return path


class ZbctlPlan:
    def __init__(self, schedule, ranks, microbatches, extra=()):
        args = [zbctl_path(), "plan", "--schedule", schedule, "--ranks", str(ranks),
                "--microbatches", str(microbatches), *extra]

        def run(fmt):
            r = subprocess.run(args + ["-o", fmt], capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise RuntimeError(f"zbctl failed: {r.stderr.strip()}")
            return r.stdout

        j = json.loads(run("json"))
        self.schedule = schedule
        self.ranks = j["ranks"]
        self.chunks = j["chunks"]
        self.microbatches = j["microbatches"]
        n, p = self.ranks * self.chunks, self.ranks
        if j["placement"] == "v":
            self.placement = [s if s < p else 2 * p - 1 - s for s in range(n)]
        else:
            self.placement = [s % p for s in range(n)]
        self.figures = {k: j[k] for k in ("makespan", "bubble_ratio", "peak_memory")}
        self._csv_comm = run("csv-comm")
        self._csv = run("csv")

    def csv_comm(self):
        return self._csv_comm

    def csv(self):
        return self._csv
