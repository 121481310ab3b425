"""A zb plan as a ready PyTorch pipeline schedule (docs/pytorch.md).

Only a duck-typed plan is needed: ``plan.placement`` (stage -> rank),
``plan.chunks`` (stages per rank), ``plan.ranks``, ``plan.microbatches`` and
``plan.csv_comm()`` (zbctl's -o csv-comm text).
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from zb import ZbError

# one action of PyTorch's CSV: stage, kind, optional microbatch
_ACTION = re.compile(r"^(\d+)([A-Z_]+?)(\d*)$")
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")
_COMPUTE = {"F", "I", "B", "W"}


class PlanError(ZbError):
    """A plan that cannot be run as asked (bad shape, rank or csv-comm).
    A zb.ZbError (so a ValueError, as before): the package's one family."""


def _plan_shape(plan: Any) -> tuple[int, int, int, list[int]]:
    try:
        p, v, m = int(plan.ranks), int(plan.chunks), int(plan.microbatches)
        placement = [int(r) for r in plan.placement]
    except AttributeError as e:
        raise PlanError(f"plan lacks {e.name!r}: a zb Plan (or an object with ranks, chunks, "
                        "microbatches, placement and csv_comm()) is needed") from e
    if p < 1 or v < 1 or m < 1:
        raise PlanError(f"plan has ranks={p}, chunks={v}, microbatches={m}; each must be >= 1")
    if len(placement) != p * v:
        raise PlanError(f"plan.placement has {len(placement)} stages, ranks*chunks is {p * v}")
    for r in range(p):
        held = placement.count(r)
        if held != v:
            raise PlanError(f"plan.placement gives rank {r} {held} stages, chunks is {v}")
    return p, v, m, placement


def _split_actions(token: str) -> list[tuple[int, str, int | None]]:
    """The leaf actions of one CSV cell ('0F1', '(0F3;3B1)OVERLAP_F_B')."""
    token = token.strip()
    if not token:
        return []
    mo = _OVERLAP.match(token)
    parts = mo.group(1).split(";") if mo else [token]
    leaves = []
    for part in parts:
        ma = _ACTION.match(part.strip())
        if not ma:
            raise PlanError(f"csv-comm: cannot parse action {part!r}")
        leaves.append((int(ma.group(1)), ma.group(2), int(ma.group(3)) if ma.group(3) else None))
    return leaves


def csv_rows(text: str) -> list[list[str]]:
    """csv-comm (or csv) text as one list of action strings per rank."""
    rows = []
    for line in text.splitlines():
        if line.strip() == "" or line.lstrip().startswith("#"):
            continue
        rows.append([c.strip() for c in line.split(",") if c.strip()])
    return rows


def add_reduce_grad(rows: list[list[str]], microbatches: int) -> list[list[str]]:
    """Insert 'sREDUCE_GRAD', 'sWAIT_REDUCE_GRAD' after each stage's last
    backward (its m-th B or W), as PyTorch's own lowering does, for every
    stage whose row has no REDUCE_GRAD yet. Without them PyTorch's runtime
    never scales the gradients by 1/m (scale_grads=True) nor finishes an
    FSDP reduction. Rows that already carry them are returned unchanged."""
    out = []
    for row in rows:
        has = {s for tok in row for s, kind, _ in _split_actions(tok) if kind == "REDUCE_GRAD"}
        count: dict[int, int] = {}
        new = []
        for tok in row:
            new.append(tok)
            for s, kind, _ in _split_actions(tok):
                if kind in ("B", "W") and s not in has:
                    count[s] = count.get(s, 0) + 1
                    if count[s] == microbatches:
                        new += [f"{s}REDUCE_GRAD", f"{s}WAIT_REDUCE_GRAD"]
        out.append(new)
    return out


def compute_rows(rows: list[list[str]]) -> list[list[str]]:
    """The compute actions alone (F, I, B, W, OVERLAP_F_B): PyTorch's
    'compute_only' CSV, which its runtime (and torchtitan) lowers itself."""
    return [[tok for tok in row if all(k in _COMPUTE for _, k, _ in _split_actions(tok))] for row in rows]


def _check_rows(rows: list[list[str]], p: int, m: int, placement: list[int]) -> None:
    if len(rows) != p:
        raise PlanError(f"csv-comm has {len(rows)} rows, the plan has {p} ranks")
    for r, row in enumerate(rows):
        for tok in row:
            for s, kind, mb in _split_actions(tok):
                if s >= len(placement) or placement[s] != r:
                    raise PlanError(f"csv-comm row {r} has {tok!r}, but stage {s} is placed on rank "
                                    f"{placement[s] if s < len(placement) else '(none)'}")
                if mb is not None and mb >= m:
                    raise PlanError(f"csv-comm row {r} has {tok!r}: microbatch {mb} >= {m}")


def stages_of(plan: Any, rank: int) -> list[int]:
    """The stage indices ``rank`` holds under the plan's placement, ascending
    (loop: r, r+p, ...; V: r and 2p-1-r)."""
    p, _, _, placement = _plan_shape(plan)
    if not 0 <= rank < p:
        raise PlanError(f"rank {rank} is outside the plan's {p} ranks")
    return [s for s, r in enumerate(placement) if r == rank]


def schedule(plan: Any, rank: int, stage_fn: Callable[[int], nn.Module], *,
             loss_fn: Callable[..., torch.Tensor], n_microbatches: int | None = None,
             group: dist.ProcessGroup | None = None, device: torch.device | str | None = None,
             scale_grads: bool = True, add_missing_reduce_grad: bool = True) -> _PipelineScheduleRuntime:
    """A ready PyTorch schedule running ``plan`` on pipeline rank ``rank``.

    Builds one ``PipelineStage(stage_fn(s), s, ...)`` for each stage s the
    plan places on ``rank`` (loop or V placement alike), loads the plan's
    csv-comm into ``_PipelineScheduleRuntime`` (format 'compute_comms') and
    returns it: call ``step(x, target=y)`` (x on the rank holding stage 0,
    y on the one holding the last stage). ``loss_fn(output, target)`` is the
    per-microbatch loss; with ``scale_grads=True`` (PyTorch's default) the
    gradients are divided by the microbatch count, matching a mean loss over
    the whole batch. A csv-comm without REDUCE_GRAD actions would skip that
    division; they are inserted after each stage's last backward unless
    ``add_missing_reduce_grad=False``.

    The process group (default: the world) must have ``plan.ranks`` members,
    this process being member ``rank``.
    """
    p, v, m, placement = _plan_shape(plan)
    if n_microbatches is not None and n_microbatches != m:
        raise PlanError(f"n_microbatches={n_microbatches}, but the plan was made for {m} microbatches")
    if not dist.is_initialized():
        raise PlanError("torch.distributed is not initialised: call init_process_group first")
    size = dist.get_world_size(group)
    if size != p:
        raise PlanError(f"the process group has {size} ranks, the plan {p}")
    own = dist.get_rank(group)
    if own != rank:
        raise PlanError(f"rank={rank}, but this process is rank {own} of the group")
    if device is None:
        backend = dist.get_backend(group)
        device = (torch.device("cuda", torch.cuda.current_device())
                  if backend == "nccl" and torch.cuda.is_available() else torch.device("cpu"))
    device = torch.device(device)

    rows = csv_rows(plan.csv_comm())
    _check_rows(rows, p, m, placement)
    if add_missing_reduce_grad:
        rows = add_reduce_grad(rows, m)

    n_stages = p * v
    stages = []
    for s in stages_of(plan, rank):
        mod = stage_fn(s)
        if not isinstance(mod, nn.Module):
            raise PlanError(f"stage_fn({s}) returned {type(mod).__name__}, not an nn.Module")
        stages.append(PipelineStage(mod.to(device), s, n_stages, device, group=group))

    sched = _PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=loss_fn, scale_grads=scale_grads)
    fd, path = tempfile.mkstemp(prefix="zb-csv-comm-", suffix=".csv")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(",".join(row) for row in rows) + "\n")
        sched._load_csv(path, format="compute_comms")
    finally:
        os.unlink(path)
    return sched
