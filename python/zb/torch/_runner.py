"""One Assignment run through PyTorch (docs/pytorch.md, Attaching a
torchrun job): the rank's lowered action list (Assignment.action_list) as
its row of PyTorch's compute_comms CSV, the stages it hosts as
PipelineStages around the script's modules, and each compute op timed by
wrapping the stage's forward / backward-input / backward-weight calls.

PyTorch's loader infers stage -> rank from every rank's row, but an
Assignment carries only this rank's list (docs/wire.md, Assignment): the
other rows are placeholders (each of their stages' F then B per
microbatch) built from the placement, read for their stage sets only;
this process executes its own row alone.

Private PyTorch API, on purpose: _PipelineScheduleRuntime and its
_load_csv are the only way PyTorch runs an arbitrary per-rank action list
(compute_comms CSV, sends and receives included), which is what an
Assignment is; the public schedules build their own lists. Written and
tested against torch 2.15 (scripts/install-hf-venv.sh; bridge.py relies on
the same two); a torch that renames or changes them breaks here first,
and tests/torch/test_agent_torch.py says so.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from .bridge import PlanError, add_reduce_grad

# ActionKind (proto/zb/v1/zb.proto) -> PyTorch's action name
_KIND = {1: "F", 2: "I", 3: "W", 4: "B", 5: "SEND_F", 6: "RECV_F", 7: "SEND_B", 8: "RECV_B",
         9: "REDUCE_GRAD", 10: "WAIT_REDUCE_GRAD"}
K_F, K_B, K_W, K_BW = 1, 2, 3, 4


def placement(p: int, v: int, rank: int, own: list[int]) -> list[int]:
    """Stage -> rank for a plan of p ranks and v chunks whose rank `rank`
    hosts `own`: V (rank r holds r and 2p-1-r) when own says so, else loop
    (stage s on s mod p), the two placements zb plans use."""
    if v == 2 and own == sorted([rank, 2 * p - 1 - rank]) and p > 1:
        return [s if s < p else 2 * p - 1 - s for s in range(2 * p)]
    pl = [s % p for s in range(p * v)]
    if [s for s, r in enumerate(pl) if r == rank] != own:
        raise PlanError(f"rank {rank} hosts stages {own}: neither loop nor V placement of {p} ranks x {v}")
    return pl


def own_row(assign: Any) -> list[str]:
    """The Assignment's action list as one compute_comms row: each send's
    WAIT_SEND at the end (the list has no waits; a wait there is always
    valid), REDUCE_GRAD after each stage's last backward (bridge)."""
    al = assign.action_list
    n = len(al.kind)
    if not (len(al.stage) == len(al.microbatch) == n):
        raise PlanError(f"assignment.action_list: columns of unequal length ({n}, {len(al.stage)}, "
                        f"{len(al.microbatch)})")
    row, waits = [], []
    for k, s, mb in zip(al.kind, al.stage, al.microbatch):
        name = _KIND.get(k)
        if name is None:
            raise PlanError(f"assignment.action_list: action kind {k} is not one PyTorch runs")
        row.append(f"{s}{name}{mb if mb >= 0 else ''}")
        if name in ("SEND_F", "SEND_B"):
            waits.append(f"{s}WAIT_{name}{mb}")
    return add_reduce_grad([row], assign.microbatches)[0] + waits


def _placeholder(pl: list[int], r: int, m: int) -> list[str]:
    return [f"{s}{k}{mb}" for s, q in enumerate(pl) if q == r for k in ("F", "B") for mb in range(m)]


class Timer:
    """The compute ops of one iteration: (kind, stage, microbatch, start,
    duration) in time.monotonic seconds, from wrapped stage calls."""

    def __init__(self):
        self.ops: list[tuple[int, int, int, float, float]] = []

    def wrap(self, stage: PipelineStage) -> None:
        idx = stage.stage_index

        def timed(fn: Callable, kind_of: Callable[..., int]):
            def call(mb, *a, **kw):
                t0 = time.monotonic()
                try:
                    return fn(mb, *a, **kw)
                finally:
                    self.ops.append((kind_of(*a, **kw), idx, int(mb), t0, time.monotonic() - t0))
            return call

        def bkind(loss=None, full_backward=True, *_, **__):
            return K_BW if full_backward else K_B

        stage.forward_one_chunk = timed(stage.forward_one_chunk, lambda *a, **kw: K_F)
        stage.backward_one_chunk = timed(stage.backward_one_chunk, bkind)
        stage.backward_weight_one_chunk = timed(stage.backward_weight_one_chunk, lambda *a, **kw: K_W)


def build(assign: Any, modules: dict[int, nn.Module], loss_fn: Callable, group, device) -> tuple[Any, Timer]:
    """A ready runtime for assign (this rank's stages wrapped around
    modules, by stage index) and the timer of its ops."""
    p, v, m = assign.ranks, max(assign.chunks, 1), assign.microbatches
    own = sorted(st.stage for st in assign.stages)
    if sorted(modules) != own:
        raise PlanError(f"the assignment (plan version {assign.plan_version}) gives rank {assign.rank} stages "
                        f"{own}, its modules are stages {sorted(modules)}: moving stages between ranks "
                        "is not supported")
    pl = placement(p, v, assign.rank, own)
    rows = [_placeholder(pl, r, m) for r in range(p)]
    rows[assign.rank] = own_row(assign)
    timer = Timer()
    stages = []
    for s in own:
        st = PipelineStage(modules[s], s, p * v, device, group=group)
        timer.wrap(st)
        stages.append(st)
    sched = _PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=loss_fn, scale_grads=True)
    fd, path = tempfile.mkstemp(prefix="zb-assign-", suffix=".csv")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(",".join(row) for row in rows) + "\n")
        sched._load_csv(path, format="compute_comms")
    finally:
        os.unlink(path)
    return sched, timer


def figures(timer: Timer, wall: float) -> dict[str, float]:
    """Busy seconds by kind (a fused BW counts as B), idle and bubble."""
    busy = {K_F: 0.0, K_B: 0.0, K_W: 0.0}
    for kind, _, _, _, d in timer.ops:
        busy[K_B if kind == K_BW else kind] += d
    idle = max(wall - sum(busy.values()), 0.0)
    return {"busy_f_seconds": busy[K_F], "busy_b_seconds": busy[K_B], "busy_w_seconds": busy[K_W],
            "idle_seconds": idle, "bubble_ratio": idle / wall if wall > 0 else 0.0}


def timeline(timer: Timer, t_start: float, pb: Any) -> None:
    """Fills OpTimeline pb with the ops in the order they ran."""
    for kind, s, mb, t0, d in sorted(timer.ops, key=lambda o: o[3]):
        pb.kind.append(kind)
        pb.stage.append(s)
        pb.microbatch.append(mb)
        pb.start_us.append(max(int((t0 - t_start) * 1e6), 0))
        pb.duration_us.append(max(int(d * 1e6), 0))
        pb.group_size.append(0)


def loss_value(losses: list) -> float:
    return float(torch.stack([torch.as_tensor(x).detach().double() for x in losses]).mean())
