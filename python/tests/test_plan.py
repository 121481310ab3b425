"""The zb package against zbctl, its oracle (python/README.md).

Every family at p = 2 and 4 (m = 8), and shapes with costs, limits,
per-stage times and zb-auto's objective: zb.plan's json(), csv() and
csv_comm() are the bytes `zbctl plan -o ...` writes (json's
generation_seconds, a time, set aside), its figures and actions are the
json's, its errors carry zbctl's messages, bad types name the argument,
and many plans leave the process's memory flat.

Run by python/tests/run.sh (ctest python_plan) with the package installed
in a venv: python test_plan.py ZBCTL  (or ZBCTL in the environment).
"""
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import unittest

import zb

ZBCTL = os.environ.get("ZBCTL", "")
GEN_SECONDS = re.compile(r'"generation_seconds": [^,\n]*')


def zbctl(*args, fmt="json"):
    """(exit status, stdout, stderr) of `zbctl plan ARGS -o FMT`."""
    r = subprocess.run([ZBCTL, "plan", *args, "-o", fmt], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def zbctl_message(stderr):
    """zbctl's message as the package words it: no 'zbctl plan: ' prefix,
    options named as the arguments ('--ranks' is 'ranks')."""
    line = stderr.splitlines()[0]
    return line.removeprefix("zbctl plan: ").replace("--", "")


def no_time(text):
    return GEN_SECONDS.sub('"generation_seconds": T', text)


def action_string(a):
    """PyTorch's action string of a zb.Action, as the json writes it."""
    kind = {"B": "I", "BW": "B"}.get(a.kind, a.kind)
    return f"{a.stage}{kind}{'' if a.microbatch is None else a.microbatch}"


def cells(actions):
    """A rank's CSV cells: an overlapped pair is one "(A;B)OVERLAP_F_B"."""
    out, pending = [], None
    for a in actions:
        text = action_string(a)
        if pending is not None:
            out.append(f"({pending};{text})OVERLAP_F_B")
            pending = None
        elif a.overlap:
            pending = text
        else:
            out.append(text)
    return out


def twelve(x):
    """x as the json writes it (%.12g) and reads back."""
    return float(f"{x:.12g}")


def args_of(schedule, p, m, **kw):
    """zbctl's options for zb.plan's arguments."""
    args = ["--schedule", schedule, "--ranks", str(p), "--microbatches", str(m)]
    for key, flag in (("chunks", "--chunks"), ("mem_limit", "--mem-limit"), ("objective", "--objective")):
        if kw.get(key) is not None:
            args += [flag, str(kw[key])]
    for key, flag in (("costs", "--costs"), ("mem", "--mem")):
        if kw.get(key) is not None:
            args += [flag, ",".join(f"{x:g}" for x in kw[key])]
    return args


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


class MatchesZbctl(unittest.TestCase):
    def check(self, schedule, p, m, stage_file=None, **kw):
        args = args_of(schedule, p, m, **kw) + (["--stage-costs", stage_file] if stage_file else [])
        rc, out, err = zbctl(*args)
        if rc != 0:  # a shape the family refuses: the same refusal
            with self.assertRaises(zb.ZbError) as cm:
                zb.plan(schedule, p, m, **kw)
            self.assertEqual(str(cm.exception), zbctl_message(err))
            return None
        plan = zb.plan(schedule, p, m, **kw)
        self.assertEqual(no_time(plan.json()), no_time(out))
        self.assertEqual(plan.csv(), zbctl(*args, fmt="csv")[1])
        self.assertEqual(plan.csv_comm(), zbctl(*args, fmt="csv-comm")[1])
        self.check_against_json(plan, json.loads(out))
        return plan

    def check_against_json(self, plan, doc):
        self.assertEqual(plan.schedule, doc["schedule"])
        self.assertEqual((plan.ranks, plan.chunks, plan.microbatches), (doc["ranks"], doc["chunks"], doc["microbatches"]))
        self.assertEqual(plan.placement_kind, doc["placement"])
        for fig, want in ((plan.figures, doc), (plan.compute_figures, doc["compute_only"])):
            got = (fig.makespan, fig.bubble_ratio, fig.bubble_ratio_paper)
            self.assertEqual(tuple(map(twelve, got)), (want["makespan"], want["bubble_ratio"], want["bubble_ratio_paper"]))
            self.assertEqual([twelve(x) for x in fig.peak_memory], want["peak_memory"])
        self.assertEqual([[action_string(a) for a in rank] for rank in plan.actions], doc["actions"])
        compute = [cells(rank) for rank in plan.compute_actions]
        self.assertEqual(compute, [row.split(",") for row in plan.csv().splitlines()])
        for rank in plan.actions:
            for a in rank:
                if a.kind.startswith(("SEND", "RECV")):
                    self.assertIsNotNone(a.peer)
                    self.assertNotEqual(plan.placement[a.stage], a.peer)
                else:
                    self.assertIsNone(a.peer)
        p, v = plan.ranks, plan.chunks
        want = [s % p if plan.placement_kind == "loop" else (s if s < p else 2 * p - 1 - s) for s in range(p * v)]
        self.assertEqual(list(plan.placement), want)

    def test_every_family_default_costs(self):
        self.assertEqual(len(zb.families()), 11)
        planned = 0
        for family in zb.families():
            for p in (2, 4):
                with self.subTest(family=family, p=p):
                    planned += self.check(family, p, 8) is not None
        self.assertGreaterEqual(planned, 20)  # refusals are compared too, but most plan

    def test_costs_limits_objective_chunks(self):
        cases = [
            ("zb-h1", 4, 8, dict(costs=(1, 2, 1, 0.25), mem=(2, -1, -1))),
            ("zb-auto", 4, 8, dict(costs=(1, 1.5, 0.5), mem_limit="2p")),
            ("zb-auto", 4, 8, dict(mem_limit="0.5p", objective="span")),
            ("zb-auto", 4, 8, dict(chunks=1, mem_limit="2p")),
            ("interleaved-1f1b", 4, 8, dict(chunks=3, costs=(1, 1, 1, 0.1))),
            ("zb-v", 4, 8, dict(costs=(1, 1, 1, 0.5), mem=(1, 0.5, -1.5))),
            ("dualpipe-v", 4, 10, dict(costs=(2, 1, 1, 0.2))),
        ]
        for schedule, p, m, kw in cases:
            with self.subTest(schedule=schedule, **kw):
                self.assertIsNotNone(self.check(schedule, p, m, **kw))

    def test_stage_costs(self):
        rows = [(1, 2, 1), (1, 1, 1), (2, 1, 1), (1, 1, 3)]
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("".join(f"{a},{b},{c}\n" for a, b, c in rows))
        try:
            self.assertIsNotNone(self.check("zb-h2", 4, 8, stage_file=f.name, stage_costs=rows))
            self.assertIsNotNone(self.check("zb-auto", 4, 8, stage_file=f.name, stage_costs=rows))
        finally:
            os.unlink(f.name)

    def test_pickles_as_its_arguments(self):
        # a Plan crosses to spawned processes: unpickling plans it again,
        # and the same arguments give the same plan, byte for byte
        for schedule, kw in (("zb-v", {}), ("zb-auto", dict(stage_costs=[(1, 2, 1), (2, 1, 1)], mem_limit="2p"))):
            with self.subTest(schedule=schedule):
                plan = zb.plan(schedule, 2, 6, **kw)
                back = pickle.loads(pickle.dumps(plan))
                self.assertIsNot(back, plan)
                self.assertEqual((back.schedule, back.csv_comm(), back.figures), (plan.schedule, plan.csv_comm(), plan.figures))
                self.assertEqual(no_time(back.json()), no_time(plan.json()))


class Errors(unittest.TestCase):
    def same_error(self, schedule, p, m, **kw):
        rc, _, err = zbctl(*args_of(schedule, p, m, **kw))
        self.assertNotEqual(rc, 0)
        with self.assertRaises(zb.ZbError) as cm:
            zb.plan(schedule, p, m, **kw)
        self.assertEqual(str(cm.exception), zbctl_message(err))
        self.assertIsInstance(cm.exception, ValueError)
        return cm.exception

    def test_zbctls_messages(self):
        self.same_error("zb-v", 0, 8)
        self.same_error("zb-v", 4, 0)
        self.same_error("zb-x", 4, 8)
        self.same_error("1f1b", 4, 8, costs=(1, -1, 1))
        self.same_error("zb-h1", 4, 8, mem=(1, 0.5, -0.5))
        self.same_error("1f1b", 4, 8, mem=(0, 0, 0))
        self.same_error("zb-v", 4, 8, chunks=3)
        self.same_error("1f1b", 4, 8, objective="span")
        self.same_error("1f1b", 4, 8, mem_limit="0.5p")
        e = self.same_error("zb-auto", 4, 8, mem_limit=0.1)
        self.assertEqual(e.error, "infeasible")

    def test_bad_values_named(self):
        for kw, name in ((dict(mem_limit="2q"), "mem_limit"), (dict(mem_limit=-1), "mem_limit"),
                         (dict(costs=(1, 1)), "costs"), (dict(costs="1,x,1"), "costs"),
                         (dict(objective="fast"), "objective"), (dict(chunks=65), "chunks"),
                         (dict(stage_costs=[(1, 1)]), "stage_costs"), (dict(stage_costs=[(1, 1, 1)] * 3), "stage_costs")):
            with self.subTest(**kw):
                with self.assertRaisesRegex(zb.ZbError, name):
                    zb.plan("1f1b", 4, 8, **kw)

    def test_types(self):
        for args, kw, name in ((("1f1b", "4", 8), {}, "ranks"), (("1f1b", 4, 8.0), {}, "microbatches"),
                               (("1f1b", True, 8), {}, "ranks"), ((None, 4, 8), {}, "schedule"),
                               (("1f1b", 4, 8), dict(chunks="1"), "chunks"), (("1f1b", 4, 8), dict(costs=5), "costs"),
                               (("1f1b", 4, 8), dict(mem=("a", 1, 1)), "mem"),
                               (("1f1b", 4, 8), dict(mem_limit=[2]), "mem_limit"),
                               (("1f1b", 4, 8), dict(objective=1), "objective"),
                               (("1f1b", 4, 8), dict(stage_costs=4), "stage_costs")):
            with self.subTest(args=args, **kw):
                with self.assertRaisesRegex(TypeError, name):
                    zb.plan(*args, **kw)


class Memory(unittest.TestCase):
    def test_rss_flat_over_many_plans(self):
        def one():
            plan = zb.plan("zb-v", 8, 16, costs=(1, 1, 1, 0.1))
            plan.json(), plan.csv(), plan.csv_comm(), plan.actions, plan.compute_actions
            try:
                zb.plan("zb-auto", 4, 8, mem_limit=0.1)
            except zb.ZbError:
                pass
        for _ in range(200):  # the allocator's pools, warm
            one()
        before = rss_kib()
        for _ in range(3000):
            one()
        # flat: ~0.2 MiB here; a plan's lists, figures and costs left
        # unfreed (~24 KiB a call) grow it by ~70 MiB
        self.assertLess(rss_kib() - before, 16 * 1024)


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        ZBCTL = sys.argv.pop(1)
    if not ZBCTL or not os.access(ZBCTL, os.X_OK):
        sys.exit(f"test_plan.py: give zbctl's path (argument or ZBCTL); got '{ZBCTL}'")
    unittest.main(verbosity=2)
