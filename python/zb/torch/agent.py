"""zb.torch.attach: a torchrun process as a worker of a zb job
(docs/pytorch.md, Attaching a torchrun job).

Every process of the run calls attach() with the same run id; process
rank r attaches bound to (run, r) and the coordinator gives it rank r of
the torch job whose spec names that run (JobSpec.torch_run). The agent
receives the Assignment, builds its stages from the script's stage_fn,
runs each iteration through PyTorch's _PipelineScheduleRuntime, reports
what it measured, and switches plans at the iteration an update names::

    agent = zb.torch.attach("host:7070", run="run-1", stage_fn=make_stage, loss_fn=mse)
    opt = torch.optim.SGD(agent.parameters(), lr=0.1)
    with agent:
        for it in agent.iterations():
            opt.zero_grad()
            agent.step(x[it], target=y[it])
            opt.step()
"""

from __future__ import annotations

import socket
import time
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from . import _runner
from ._wire import AttachError, Link, need_grpc


class Agent:
    """One process's part of a torch job. Owns its Link (closed by close())."""

    def __init__(self, link: Link, assign: Any, stage_fn: Callable[[int], nn.Module], loss_fn: Callable,
                 group, device, wait_s: float):
        self._link, self._loss_fn, self._group, self._device = link, loss_fn, group, device
        self._wait_s = wait_s
        self.assignment = assign
        self.job_id, self.rank = assign.job_id, assign.rank
        self.modules: dict[int, nn.Module] = {}
        for st in sorted(assign.stages, key=lambda x: x.stage):
            mod = stage_fn(st.stage)
            if not isinstance(mod, nn.Module):
                raise AttachError(f"stage_fn({st.stage}) returned {type(mod).__name__}, not an nn.Module")
            self.modules[st.stage] = mod.to(device)
        self._sched, self._timer = _runner.build(assign, self.modules, loss_fn, group, device)
        self._updates: dict[int, Any] = {}  # first_iteration -> Assignment
        self._current = None  # the iteration yielded and not yet stepped
        self.cancelled = False
        self.plan_versions: list[int] = []  # by iteration run, for the script's own checks

    # ---- the script's API ----

    def parameters(self) -> Iterator[nn.Parameter]:
        for s in sorted(self.modules):
            yield from self.modules[s].parameters()

    def iterations(self) -> Iterator[int]:
        """The job's iterations from the Assignment's first, one at a time:
        the caller runs step() once per iteration. Stops early when the job
        is cancelled (self.cancelled); reports done after the last."""
        a = self.assignment
        for it in range(a.first_iteration, a.iterations):
            self._drain()
            if self.cancelled:
                return
            self._switch_if_due(it)
            self._current = it
            yield it
            if self._current is not None:
                self._fail(f"iteration {it}: step() was not called")
        resp = self._link.report(self._pb.ReportRequest(worker_id=self._link.worker_id, job_id=self.job_id,
                                                        rank=self.rank, done=True))
        if not resp.stop:
            self._await_release()

    def _await_release(self) -> None:
        """After done, stay attached until the job ends (the coordinator
        releases every rank when the last is done): an agent that left
        earlier would be a lost worker of a running job."""
        deadline = time.monotonic() + self._wait_s
        while not self.cancelled:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AttachError(f"job {self.job_id}: not released within {self._wait_s:g} s of rank "
                                  f"{self.rank}'s last iteration")
            cmd = self._link.next_command(min(left, 1.0))
            if cmd is not None and cmd.WhichOneof("kind") == "release_job_id" and cmd.release_job_id == self.job_id:
                return

    def step(self, inputs: torch.Tensor | None = None, target: torch.Tensor | None = None) -> float | None:
        """Runs the current iteration's plan (inputs used on the rank with
        stage 0, target on the rank with the last stage) and reports it.
        Returns the mean microbatch loss on the last stage's rank, else None."""
        it = self._current
        if it is None:
            raise AttachError("step() outside agent.iterations()")
        a = self.assignment
        n_stages = a.ranks * max(a.chunks, 1)
        args = (inputs.to(self._device),) if 0 in self.modules else ()
        tgt = target.to(self._device) if (n_stages - 1) in self.modules else None
        losses: list = []
        self._timer.ops.clear()
        t0 = time.monotonic()
        try:
            self._sched.step(*args, target=tgt, losses=losses)
        except Exception as e:
            self._fail(f"iteration {it}: {type(e).__name__}: {e}")
            raise
        wall = time.monotonic() - t0
        loss = _runner.loss_value(losses) if tgt is not None and losses else None
        self._report(it, t0, wall, loss)
        self._current = None
        self.plan_versions.append(a.plan_version)
        return loss

    # ---- reports and commands ----

    @property
    def _pb(self):
        from zb.v1 import zb_pb2
        return zb_pb2

    def _report(self, it: int, t0: float, wall: float, loss: float | None) -> None:
        a = self.assignment
        ri = self._pb.RankIteration(rank=self.rank, wall_seconds=wall, start_monotonic_seconds=t0,
                                    clock_offset_seconds=self._link.clock_offset,
                                    clock_rtt_seconds=self._link.clock_rtt,
                                    **_runner.figures(self._timer, t0, wall))
        if loss is not None:
            ri.loss, ri.has_loss = loss, True
        if a.trace_every > 0 and it % a.trace_every == 0:
            _runner.timeline(self._timer, t0, ri.timeline)
        resp = self._link.report(self._pb.ReportRequest(worker_id=self._link.worker_id, job_id=self.job_id,
                                                        rank=self.rank, iteration=it,
                                                        plan_version=a.plan_version, metrics=ri))
        if resp.stop:
            self.cancelled = True

    def _fail(self, why: str) -> None:
        try:
            self._link.report(self._pb.ReportRequest(worker_id=self._link.worker_id, job_id=self.job_id,
                                                     rank=self.rank, error=why[:1000]))
        finally:
            raise AttachError(why)

    def _drain(self) -> None:
        while (cmd := self._link.next_command(0)) is not None:
            kind = cmd.WhichOneof("kind")
            if kind == "release_job_id" and cmd.release_job_id == self.job_id:
                self.cancelled = True
            elif kind == "assign" and cmd.assign.job_id == self.job_id:
                if cmd.assign.plan_version > self.assignment.plan_version:
                    self._updates[cmd.assign.first_iteration] = cmd.assign

    def _switch_if_due(self, it: int) -> None:
        late = [k for k in self._updates if k < it]
        if late:
            self._fail(f"plan update for iteration {late[0]} arrived after it started (now {it})")
        new = self._updates.pop(it, None)
        if new is None:
            return
        try:
            self._sched, self._timer = _runner.build(new, self.modules, self._loss_fn, self._group, self._device)
        except Exception as e:
            self._fail(f"plan version {new.plan_version} ({new.schedule}) at iteration {it}: {e}")
        self.assignment = new

    def close(self) -> None:
        """Ends the Attach stream and the heartbeats (joins both threads)."""
        self._link.close()

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        self.close()
        return False


def attach(coordinator: str, *, run: str, stage_fn: Callable[[int], nn.Module], loss_fn: Callable,
           rank: int | None = None, worker: str | None = None, ca: str | None = None, cert: str | None = None,
           key: str | None = None, group=None, device: torch.device | str | None = None,
           wait_s: float = 600.0, heartbeat_s: float = 0.5) -> Agent:
    """Attaches this process (torchrun rank `rank`, default the process
    group's) as the agent of (run, rank) and waits up to wait_s for its
    Assignment. With mutual TLS (ca, cert, key: a worker certificate
    zb://worker/NAME) the worker id is NAME/RANK, `worker` being NAME;
    plaintext without them (worker default: "torch-" + run)."""
    need_grpc()
    from zb.v1 import zb_pb2
    if not dist.is_initialized():
        raise AttachError("torch.distributed is not initialised: call init_process_group first")
    rank = dist.get_rank(group) if rank is None else rank
    device = torch.device(device or "cpu")
    wid = f"{worker or 'torch-' + run}/{rank}"
    req = zb_pb2.AttachRequest(worker_id=wid, data_address=f"{socket.gethostname()}:0", backends=["torch"],
                               transports=["torch"], hostname=socket.gethostname(), torch_run=run,
                               torch_rank=rank, blas="none", max_receive_bytes=4 << 20)  # gRPC Python's default
    link = Link(coordinator, req, ca=ca, cert=cert, key=key, heartbeat_s=heartbeat_s)
    try:
        link.start_heartbeats()
        deadline = time.monotonic() + wait_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AttachError(f"no assignment for run {run} rank {rank} within {wait_s:g} s")
            cmd = link.next_command(min(left, 1.0))
            if cmd is not None and cmd.WhichOneof("kind") == "assign":
                break
        a = cmd.assign
        if a.backend != "torch" or a.rank != rank:
            raise AttachError(f"assignment of job {a.job_id} is backend {a.backend!r} rank {a.rank}; this agent "
                              f"is rank {rank} of a torch run")
        size = dist.get_world_size(group)
        if size != a.ranks:
            raise AttachError(f"job {a.job_id} has {a.ranks} ranks, the process group {size}")
        try:
            return Agent(link, a, stage_fn, loss_fn, group, device, wait_s)
        except Exception as e:  # the job's other ranks would wait for this one: say why it failed
            link.report(zb_pb2.ReportRequest(worker_id=wid, job_id=a.job_id, rank=rank,
                                             error=f"building rank {rank}'s stages: {e}"[:1000]))
            raise
    except BaseException:
        link.close()
        raise
