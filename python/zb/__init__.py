"""zb: zero-bubble pipeline-parallel schedules, planned in-process by
libzb (the C core of zb; python/README.md, docs/schedules.md).

    import zb
    p = zb.plan("zb-v", ranks=8, microbatches=16)
    p.figures.makespan, p.placement, p.actions[0][:4], p.csv()

zb.plan takes what `zbctl plan` takes, with the same meanings, defaults
and messages, and gives the same plan: its json(), csv() and csv_comm()
are the bytes `zbctl plan -o json|csv|csv-comm` writes (json's
generation_seconds aside, a time). Planning runs with the GIL released.
"""
# Only the extension and _args: importing zb is part of the first call's
# time (issue 32's target, < 5 ms with it), so nothing heavier here.
from . import _args, _libzb
from ._libzb import Action, Figures, ZbError

__all__ = ["Action", "Figures", "Plan", "ZbError", "families", "plan"]


def families():
    """The schedule family names zb.plan takes, in libzb's order."""
    return list(_libzb.families())


class Plan:
    """A plan made by zb.plan. Attributes:

    schedule      the report's name: the family, or "zb-auto (chose ...)"
    family        the family whose lists these are (zb-auto's choice)
    ranks, chunks, microbatches    the shape (chunks: stages per rank)
    placement_kind    "loop" (stage s on rank s mod p) or "v"
    placement     tuple, stage -> rank
    figures       zb.Figures of the lowered plan, as workers run it
    compute_figures   zb.Figures of the compute-only lists (the paper's view)
    actions       per rank, the lowered list of zb.Action (with SEND/RECV)
    compute_actions   per rank, the compute-only list of zb.Action

    zb.Action is a named tuple (kind, stage, microbatch, peer): kind "F",
    "B" (input gradient), "W", "BW" (fused), "SEND_F", "RECV_F", "SEND_B",
    "RECV_B" or a marker kind; for a SEND the sending stage, for a RECV
    the receiving one; microbatch None for FSDP kinds; peer the other rank
    of a SEND/RECV, else None. By name only: batch (a SEND/RECV posted in
    one transport group with the next action) and overlap (this compute
    action and the next run as one overlapped pair, DualPipe-V's
    "(0F3;3B1)OVERLAP_F_B"). The lists are built on first access.

    zb.Figures is a named tuple of one simulation (docs/schedules.md,
    Figures): makespan of one iteration; bubble_ratio, 1 - busy / (p *
    makespan); bubble_ratio_paper, the ZB paper's (S_max - m(T_F+T_B+T_W))
    / S_max; peak_memory, per rank, in units of one rank's M_F (1F1B's
    peak is p).
    """

    def __init__(self, result, call=None):
        self._result = result
        self._call = call  # zb.plan's arguments, for pickling
        name, family, p, v, m, kind, placement = result.info()
        self.schedule = name
        self.family = family
        self.ranks, self.chunks, self.microbatches = p, v, m
        self.placement_kind = kind
        self.placement = placement
        self.figures = result.figures(False)
        self.compute_figures = result.figures(True)
        self._lists = {}

    def _actions(self, compute):
        if compute not in self._lists:
            self._lists[compute] = self._result.actions(compute)
        return self._lists[compute]

    @property
    def actions(self):
        return self._actions(False)

    @property
    def compute_actions(self):
        return self._actions(True)

    def json(self) -> str:
        """`zbctl plan -o json`: the report, both figure sets, the lowered actions."""
        return self._result.json()

    def csv(self) -> str:
        """`zbctl plan -o csv`: the compute-only lists (PyTorch's CSV)."""
        return self._result.csv()

    def csv_comm(self) -> str:
        """`zbctl plan -o csv-comm`: the lowered lists with their sends' waits."""
        return self._result.csv_comm()

    def __reduce__(self):
        # Pickled as the arguments it was planned from, planned again when
        # unpickled (planning is deterministic: the same plan), so a Plan
        # crosses to processes spawned by multiprocessing or torchrun.
        schedule, ranks, microbatches, kwargs = self._call
        return (_replan, (schedule, ranks, microbatches, kwargs))

    def __repr__(self):
        f = self.figures
        return (f"<zb.Plan {self.schedule}: p={self.ranks} v={self.chunks} m={self.microbatches} "
                f"{self.placement_kind}, makespan {f.makespan:g}, bubble_ratio {f.bubble_ratio:.4f}>")


def plan(schedule, ranks, microbatches, *, chunks=None, costs=None, stage_costs=None, mem=None, mem_limit=None,
         objective=None):
    """Plans `schedule` on `ranks` x `microbatches` as `zbctl plan` does.

    chunks       stages per rank (None: the family's own)
    costs        (T_F, T_B, T_W[, T_comm]) of one rank's whole share, or
                 "F,B,W[,COMM]"; default (1, 1, 1, 0)
    stage_costs  per-stage (T_F, T_B, T_W), p*v rows, instead of costs' times
    mem          (M_F, M_B, M_W), default (1, -0.5, -0.5)
    mem_limit    per-rank limit: "Np" (N times 1F1B's peak) or M_F units
    objective    zb-auto only: "makespan" (default) or "span"

    Raises ZbError (a ValueError) with zb's message when zb refuses,
    TypeError naming the argument for a wrong type.
    """
    if not isinstance(schedule, str):
        raise TypeError(f"schedule must be a str (got {type(schedule).__name__})")
    p = _args.whole("ranks", ranks, 1, _args.MAX_RANKS)
    m = _args.whole("microbatches", microbatches, 1, _args.MAX_MICROBATCHES)
    v = _args.whole("chunks", chunks, 1, _args.MAX_CHUNKS, optional=True)
    t = _args.numbers_of("costs", costs, 3, 4, _args.DEFAULT_COSTS)
    mm = _args.numbers_of("mem", mem, 3, 3, _args.DEFAULT_MEM)
    units = _args.mem_limit_units(mem_limit, p)
    obj = _args.objective_code(objective)
    rows = _args.stage_rows(stage_costs)
    call = (schedule, ranks, microbatches,
            {"chunks": chunks, "costs": costs, "stage_costs": stage_costs, "mem": mem, "mem_limit": mem_limit,
             "objective": objective})
    return Plan(_libzb.plan(schedule, p, m, v, *t, *mm, units, obj, rows), call)


def _replan(schedule, ranks, microbatches, kwargs):
    return plan(schedule, ranks, microbatches, **kwargs)
