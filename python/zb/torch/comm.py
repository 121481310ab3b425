"""T_comm for zb's cost model, measured on the job's own process group
(docs/pytorch.md, profile_p2p): the one-way time of a stage's output moved
between two ranks, which zb's planner adds per hop between ranks
(``costs=(..., T_comm)``, zbctl's ``--costs F,B,W,COMM``)."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist


def profile_p2p(example: torch.Tensor, *, src: int = 0, dst: int = 1, reps: int = 20, warmup: int = 3,
                group: dist.ProcessGroup | None = None) -> float:
    """Seconds one tensor like ``example`` takes from group rank ``src`` to
    ``dst``: the median of ``reps`` round trips (after ``warmup``), halved,
    with torch.distributed's blocking send and recv as the pipelining
    runtime's p2p uses the same backend. Every rank of the group calls it;
    ranks other than src and dst only meet the others at the final
    barrier. Returns the same figure on every rank (broadcast from src)."""
    if not dist.is_initialized():
        raise RuntimeError("profile_p2p: torch.distributed is not initialised: call init_process_group first")
    if not isinstance(example, torch.Tensor):
        raise TypeError(f"profile_p2p: example must be a tensor (got {type(example).__name__})")
    size = dist.get_world_size(group)
    if src == dst or not (0 <= src < size and 0 <= dst < size):
        raise ValueError(f"profile_p2p: src {src} and dst {dst} must be two ranks of the group's 0..{size - 1}")
    if reps < 1 or warmup < 0:
        raise ValueError(f"profile_p2p: reps must be >= 1 and warmup >= 0 (got {reps}, {warmup})")
    me = dist.get_rank(group)
    to_global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
    buf = torch.empty_like(example)
    times = []
    for it in range(warmup + reps):
        if me == src:
            t0 = time.perf_counter()
            dist.send(buf, to_global(dst), group=group)
            dist.recv(buf, to_global(dst), group=group)
            if it >= warmup:
                times.append((time.perf_counter() - t0) / 2)
        elif me == dst:
            dist.recv(buf, to_global(src), group=group)
            dist.send(buf, to_global(src), group=group)
    out = torch.tensor([statistics.median(times) if times else 0.0], dtype=torch.float64)
    dist.broadcast(out, to_global(src), group=group)
    dist.barrier(group=group)
    return float(out.item())
