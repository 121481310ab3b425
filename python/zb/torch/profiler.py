"""Per-stage cost profiler for PyTorch pipeline stages (docs/pytorch.md).

Measures, for each stage module in pipeline order, the three operations a
zero-bubble schedule places separately: the forward F, the input-gradient
backward B (PyTorch's action ``I``) and the weight-gradient backward W, with
the same split PyTorch's pipelining runtime executes
(``torch.distributed.pipelining._backward.stage_backward_input`` and
``stage_backward_weight``), and the memory each one adds or frees.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.distributed.pipelining._backward import (
    stage_backward_input,
    stage_backward_weight,
)

_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}


@dataclass
class StageCost:
    """One stage's measured costs: times in seconds (medians over the
    repetitions) and memory deltas in bytes (medians), in zbctl's --mem
    convention: ``m_f > 0``, ``m_w <= 0``, ``m_f + m_b + m_w == 0``."""

    t_f: float
    t_b: float
    t_w: float
    m_f: int
    m_b: int
    m_w: int
    # CUDA only: the W delta as measured, before the sum rule sets m_w
    # (the difference is memory that outlived the iteration); None on CPU.
    m_w_measured: int | None = None


@dataclass
class ProfileResult:
    """The profiler's answer: ``stages[i]`` is stage i's :class:`StageCost`."""

    stages: list[StageCost]
    device: torch.device
    # how the memory deltas were measured: "cuda.memory_allocated" or
    # "saved-tensors" (the bytes autograd keeps for backward; CPU)
    memory_method: str
    reps: int
    raw_times: list[dict[str, list[float]]] = field(default_factory=list)

    def stage_costs(self, unit: str = "ms") -> list[tuple[float, float, float]]:
        """(T_F, T_B, T_W) per stage in ``unit`` ('s', 'ms' or 'us')."""
        if unit not in _UNITS:
            raise ValueError(f"unit must be one of {sorted(_UNITS)}, got {unit!r}")
        k = _UNITS[unit]
        return [(s.t_f * k, s.t_b * k, s.t_w * k) for s in self.stages]

    def stage_costs_text(self, unit: str = "ms") -> str:
        """zbctl's --stage-costs file: one 'T_F,T_B,T_W' line per stage, in
        pipeline order (p*v lines for a plan of p ranks and v chunks)."""
        lines = [f"# zb.torch.profile: T_F,T_B,T_W per stage in {unit} (medians of {self.reps})"]
        for t in self.stage_costs(unit):
            lines.append(",".join(f"{x:.6g}" for x in t))
        return "\n".join(lines) + "\n"

    def mem(self) -> tuple[float, float, float]:
        """(M_F, M_B, M_W) for zbctl --mem / zb.plan(mem=...): the stages'
        mean deltas in units of their mean M_F, so M_F = 1, M_W <= 0 and the
        three sum to 0 (zbctl takes one triple for every stage)."""
        n = len(self.stages)
        f = sum(s.m_f for s in self.stages) / n
        b = sum(s.m_b for s in self.stages) / n
        if f <= 0:
            raise ValueError("no stage keeps activations for backward (M_F = 0); --mem needs M_F > 0")
        b = b / f
        return (1.0, b, -(1.0 + b))

    def mem_text(self) -> str:
        """:meth:`mem` as zbctl's --mem argument, e.g. '1,0.05,-1.05'."""
        return ",".join(f"{x:.6g}" for x in self.mem())


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _tensors(xs: Sequence[Any]) -> list[torch.Tensor]:
    return [x for x in xs if isinstance(x, torch.Tensor)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return (s.data_ptr(), s.nbytes())


class _SavedBytes:
    """Counts the distinct storages autograd saves for backward while
    active, leaving out the module's parameters (they are not activations)."""

    def __init__(self, params: Sequence[torch.Tensor]):
        self.exclude = {_storage_key(p) for p in params}
        self.seen: set[tuple[int, int]] = set()
        self.bytes = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            key = _storage_key(t)
            if key not in self.exclude and key not in self.seen:
                self.seen.add(key)
                self.bytes += key[1]
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


def _grads_bytes(param_groups: list[dict[str, Any]]) -> int:
    """Bytes of the intermediate gradients stage_backward_input keeps for W."""
    seen: set[tuple[int, int]] = set()
    n = 0
    for g in param_groups:
        for tup in g.get("grads") or ():
            for t in tup or ():
                if isinstance(t, torch.Tensor):
                    key = _storage_key(t)
                    if key not in seen:
                        seen.add(key)
                        n += key[1]
    return n


def _detach_inputs(outputs: tuple) -> tuple:
    """The next stage's inputs: the previous outputs cut from its graph,
    floating tensors requiring grad (as a received activation does)."""
    res = []
    for o in outputs:
        if isinstance(o, torch.Tensor):
            d = o.detach().clone()
            if d.is_floating_point():
                d.requires_grad_(True)
            res.append(d)
        else:
            res.append(o)
    return tuple(res)


def _default_loss(out: Any) -> torch.Tensor:
    return sum(t.float().mean() for t in _tensors(_as_tuple(out)))  # type: ignore[return-value]


def _one_iteration(mod: nn.Module, inputs: tuple, *, first: bool, last: bool,
                   loss_fn: Callable[[Any], torch.Tensor], device: torch.device,
                   cuda_mem: bool) -> tuple[dict[str, float], dict[str, int], tuple]:
    """Runs F, B and W once for one stage; returns times, memory deltas and
    the stage's outputs (detached)."""
    params = [p for p in mod.parameters() if p.requires_grad]
    # fresh leaves each iteration, as a received activation is
    inputs = tuple(x.detach().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
                   for x in inputs)
    counter = _SavedBytes(params)
    mem: dict[str, int] = {}

    _sync(device)
    m0 = torch.cuda.memory_allocated(device) if cuda_mem else 0
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        out = mod(*inputs)
        outs = _as_tuple(out)
        loss = loss_fn(out) if last else None
    _sync(device)
    t1 = time.perf_counter()
    m1 = torch.cuda.memory_allocated(device) if cuda_mem else 0
    mem["f"] = (m1 - m0) if cuda_mem else counter.bytes

    if last:
        roots: list[Any] = [loss]
        out_grads = None
    else:
        roots = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
        out_grads = [torch.ones_like(o) for o in roots]
    input_values = list(inputs)

    # B and W exactly as PyTorch's runtime runs them: the first stage skips
    # the input backward and runs the whole backward in W
    # (PipelineStage.backward_one_chunk / backward_weight_one_chunk).
    _sync(device)
    t2 = time.perf_counter()
    param_groups: list[dict[str, Any]] = []
    if not first:
        _, param_groups = stage_backward_input(roots, out_grads, input_values, iter(params))
        for x in input_values:  # the input gradient is sent away, not kept
            if isinstance(x, torch.Tensor):
                x.grad = None
    _sync(device)
    t3 = time.perf_counter()
    m3 = torch.cuda.memory_allocated(device) if cuda_mem else 0
    mem["b"] = (m3 - m1) if cuda_mem else _grads_bytes(param_groups)

    detached = _detach_inputs(outs)
    if first:
        torch.autograd.backward(roots, grad_tensors=out_grads)
    else:
        stage_backward_weight(iter(params), param_groups)
    del roots, out_grads, param_groups, out, outs, loss, input_values
    _sync(device)
    t4 = time.perf_counter()
    m4 = torch.cuda.memory_allocated(device) if cuda_mem else 0
    if cuda_mem:
        mem["w_measured"] = m4 - m3
        # the detached copy handed to the next stage is not this stage's
        mem["w_measured"] -= sum(t.untyped_storage().nbytes() for t in _tensors(detached))
    times = {"f": t1 - t0, "b": t3 - t2, "w": t4 - t3}
    return times, mem, detached


def profile(stage_modules: Sequence[nn.Module], example_inputs: Any, *,
            loss_fn: Callable[[Any], torch.Tensor] | None = None,
            warmup: int = 2, reps: int = 5,
            device: torch.device | str | None = None) -> ProfileResult:
    """Measure each pipeline stage's T_F, T_B, T_W and memory deltas.

    ``stage_modules``: the stages in pipeline order. ``example_inputs``: a
    tensor or tuple of tensors, one microbatch of stage 0's input; stage k's
    input is stage k-1's output. ``loss_fn(output) -> scalar`` closes the last
    stage (bind targets in a closure; default: the mean of its outputs).
    Times are medians of ``reps`` runs after ``warmup`` runs, in seconds.

    B is the input gradient alone and W the weight gradient alone, split by
    PyTorch's own stage_backward_input / stage_backward_weight. As PyTorch's
    runtime does, stage 0 has no B (T_B = 0, M_B = 0) and its W is the whole
    backward.

    Memory: on CUDA, torch.cuda.memory_allocated deltas around F, B and W;
    on CPU, M_F is the bytes of the distinct tensors autograd saves for
    backward (saved-tensor hooks, parameters left out) and M_B the bytes of
    the intermediate gradients B keeps for W. M_W = -(M_F + M_B) (zbctl's
    sum rule; CUDA's measured W delta is kept in ``m_w_measured``).
    The modules' existing ``.grad`` are restored afterwards.
    """
    mods = list(stage_modules)
    if not mods:
        raise ValueError("profile: stage_modules is empty")
    for i, m in enumerate(mods):
        if not isinstance(m, nn.Module):
            raise TypeError(f"profile: stage_modules[{i}] is {type(m).__name__}, not an nn.Module")
    if reps < 1:
        raise ValueError(f"profile: reps must be >= 1, got {reps}")
    if warmup < 0:
        raise ValueError(f"profile: warmup must be >= 0, got {warmup}")
    inputs = _as_tuple(example_inputs)
    if not _tensors(inputs):
        raise ValueError("profile: example_inputs holds no tensor")
    if device is None:
        device = _tensors(inputs)[0].device
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    cuda_mem = device.type == "cuda"
    loss_fn = loss_fn or _default_loss
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)

    # the modules' own gradients are set aside (B and W accumulate into .grad)
    saved_grads = [[p.grad for p in m.parameters()] for m in mods]
    for m in mods:
        for p in m.parameters():
            p.grad = None
    stages: list[StageCost] = []
    raw: list[dict[str, list[float]]] = []
    try:
        n = len(mods)
        for k, mod in enumerate(mods):
            ts: dict[str, list[float]] = {"f": [], "b": [], "w": []}
            ms: dict[str, list[int]] = {"f": [], "b": [], "w_measured": []}
            next_inputs = None
            for it in range(warmup + reps):
                times, mem, out = _one_iteration(mod, inputs, first=(k == 0), last=(k == n - 1),
                                                 loss_fn=loss_fn, device=device, cuda_mem=cuda_mem)
                if next_inputs is None:
                    next_inputs = out
                if it >= warmup:
                    for key in ts:
                        ts[key].append(times[key])
                    for key in mem:
                        ms[key].append(mem[key])
            m_f = int(statistics.median(ms["f"]))
            m_b = int(statistics.median(ms["b"]))
            stages.append(StageCost(
                t_f=statistics.median(ts["f"]), t_b=statistics.median(ts["b"]),
                t_w=statistics.median(ts["w"]), m_f=m_f, m_b=m_b, m_w=-(m_f + m_b),
                m_w_measured=int(statistics.median(ms["w_measured"])) if cuda_mem else None))
            raw.append(ts)
            inputs = next_inputs
    finally:
        for m, grads in zip(mods, saved_grads):
            for p, g in zip(m.parameters(), grads):
                p.grad = g
    return ProfileResult(stages=stages, device=device,
                         memory_method="cuda.memory_allocated" if cuda_mem else "saved-tensors",
                         reps=reps, raw_times=raw)
