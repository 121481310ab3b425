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

import collections
import socket
import time
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from . import _runner
from ._wire import OUTAGE, AttachError, Link, need_grpc

# a rank's vote at an iteration boundary (Agent._agree); the largest wins
_GO, _CANCEL, _FAILED = 0, 1, 2
# reports sent again after a re-attach, as zb-worker's WORKER_SENT_REPORTS:
# the coordinator that took them may have died before completing their
# iterations, and the new one counts each once
_RESEND = 8
# reports kept while no coordinator answers; more is an outage longer than
# any recovery window, and the agent gives up rather than grow without bound
_KEEP = 10000
# the coordinator's refusal of an iteration more than its window (8) past
# the oldest incomplete one (docs/wire.md, Reports). Held reports can
# reach it: a rank back first sends its backlog before its peers send
# theirs. Then it is a "not yet", kept for the next try
_AHEAD = "ran too far ahead"


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
        # the iteration whose boundary vote this rank owes next; None inside
        # an iteration's communication (yielded, step() not done) and after
        # the loop
        self._boundary: int | None = assign.first_iteration
        self._error: str | None = None  # this rank's failure, voted at the next boundary
        self._reported = False  # an error went to the coordinator (one per agent)
        self._unsent = ""
        self._done = False
        self._sent: collections.deque = collections.deque(maxlen=_RESEND)
        self._pending: collections.deque = collections.deque()  # not yet answered, in order (_send)
        self._epoch = link.epoch
        self._released = False  # a Report after done was answered stop
        self._held = False  # an outage held reports back: _AHEAD may follow their resend
        link.running = (assign.job_id, assign.rank)  # a re-attach names it (Link._read)
        self.cancelled = False
        self.plan_versions: list[int] = []  # by iteration run, for the script's own checks

    # ---- the script's API ----

    def parameters(self) -> Iterator[nn.Parameter]:
        for s in sorted(self.modules):
            yield from self.modules[s].parameters()

    def iterations(self) -> Iterator[int]:
        """The job's iterations from the Assignment's first, one at a time:
        the caller runs step() once per iteration. Before each iteration
        and after the last, every rank of the group agrees (_agree) on
        whether to go on, so a cancel or a failure stops all of them at
        the same boundary (a rank that stopped alone would leave its peers
        waiting on the process group inside step()). Stops early when the
        job is cancelled (self.cancelled); raises AttachError when a rank
        failed; reports done after the last."""
        a = self.assignment
        for it in range(a.first_iteration, a.iterations + 1):
            self._agree(it, self._local_stop(it))
            if self.cancelled or it == a.iterations:
                break
            self._current, self._boundary = it, None
            yield it
            if self._current is not None:
                self._error, self._current = f"iteration {it}: step() was not called", None
        self._boundary = None
        if self.cancelled:
            return
        self._done = True
        self._send(self._pb.ReportRequest(worker_id=self._link.worker_id, job_id=self.job_id, rank=self.rank,
                                          done=True))
        if not self._released:
            self._await_release()

    def _local_stop(self, it: int) -> int:
        """This rank's vote at the boundary before iteration it: _GO,
        _CANCEL (told so by the coordinator) or _FAILED (self._error)."""
        if self._error is None:
            try:
                self._drain()
                self._send(None)  # what an outage held back, once a coordinator is back
                if not self.cancelled:
                    self._switch_if_due(it)
            except AttachError as e:
                self._error = str(e)
        if self._error is not None:
            return _FAILED
        return _CANCEL if self.cancelled else _GO

    def _agree(self, it: int, vote: int) -> None:
        """All-reduces every rank's vote over the group (each rank's slot
        its own, so the failed ranks are known). Reports this rank's own
        failure first, so the coordinator hears the cause, not the echo."""
        if vote == _FAILED:
            self._report_error(self._error)
        votes = _vote(self._group, self._device, vote)
        failed = [r for r, v in enumerate(votes) if v == _FAILED]
        if failed:
            self._reported = True  # the failed ranks report the cause; the others only stop
            self._boundary = None
            raise AttachError(self._error + self._unsent if vote == _FAILED else
                              f"job {self.job_id}: rank(s) {failed} failed before iteration {it}: stopping "
                              "with them (the coordinator has their error)")
        if _CANCEL in votes:
            self.cancelled = True

    def _await_release(self) -> None:
        """After done, stay attached until the job ends (the coordinator
        releases every rank when the last is done): an agent that left
        earlier would be a lost worker of a running job."""
        deadline = time.monotonic() + self._wait_s
        while not self.cancelled and not self._released:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AttachError(f"job {self.job_id}: not released within {self._wait_s:g} s of rank "
                                  f"{self.rank}'s last iteration")
            self._send(None)  # what a coordinator outage held back, done included
            if self._released:
                return
            cmd = self._link.next_command(min(left, 0.2 if self._pending else 1.0))
            if cmd is not None and cmd.WhichOneof("kind") == "release_job_id" and cmd.release_job_id == self.job_id:
                return

    def step(self, inputs: torch.Tensor | None = None, target: torch.Tensor | None = None) -> float | None:
        """Runs the current iteration's plan (inputs used on the rank with
        stage 0, target on the rank with the last stage) and reports it.
        Returns the mean microbatch loss on the last stage's rank, else None.
        A failure is reported to the coordinator and raised as AttachError."""
        it = self._current
        if it is None:
            raise AttachError("step() outside agent.iterations(), or twice in one iteration")
        a = self.assignment
        last = a.ranks * max(a.chunks, 1) - 1
        losses: list = []
        self._timer.ops.clear()
        t0 = time.monotonic()
        try:
            args = (self._need(inputs, "inputs", 0).to(self._device),) if 0 in self.modules else ()
            tgt = self._need(target, "target", last).to(self._device) if last in self.modules else None
            self._sched.step(*args, target=tgt, losses=losses)
        except Exception as e:
            self._fail(f"iteration {it}: {type(e).__name__}: {e}", e)
        wall = time.monotonic() - t0
        # the iteration's communication is over: from here a failure can
        # still be agreed at the next boundary (__exit__, _agree)
        self._current, self._boundary = None, it + 1
        loss = _runner.loss_value(losses) if tgt is not None and losses else None
        self._report(it, t0, wall, loss)
        self.plan_versions.append(a.plan_version)
        return loss

    def _need(self, t: Any, name: str, stage: int) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise AttachError(f"step(): {name} must be a tensor on the rank with stage {stage} "
                              f"(got {type(t).__name__})")
        return t

    # ---- reports and commands ----

    @property
    def _pb(self):
        from zb.v1 import zb_pb2
        return zb_pb2

    def _report(self, it: int, t0: float, wall: float, loss: float | None) -> None:
        a = self.assignment
        offset, rtt = self._link.clock()
        ri = self._pb.RankIteration(rank=self.rank, wall_seconds=wall, start_monotonic_seconds=t0,
                                    clock_offset_seconds=offset, clock_rtt_seconds=rtt,
                                    **_runner.figures(self._timer, wall))
        if loss is not None:
            ri.loss, ri.has_loss = loss, True
        if a.trace_every > 0 and it % a.trace_every == 0:
            _runner.timeline(self._timer, t0, ri.timeline)
        self._send(self._pb.ReportRequest(worker_id=self._link.worker_id, job_id=self.job_id, rank=self.rank,
                                          iteration=it, plan_version=a.plan_version, metrics=ri))

    def _send(self, req: Any) -> None:
        """Sends req (None: nothing new) after any held back, in order: the
        coordinator completes iterations in order. While no coordinator
        answers (the Link attaching again) they are kept, and the loop goes
        on; after a re-attach the last _RESEND sent go again first, as
        zb-worker does. Raises AttachError on any other failure, or when
        the outage outlasts the Link's re-attach window or _KEEP reports."""
        link = self._link
        if link.epoch != self._epoch and not link.reattaching:
            self._epoch = link.epoch
            self._pending.extendleft(reversed(self._sent))
            self._sent.clear()
        if req is not None:
            self._pending.append(req)
        if len(self._pending) > _KEEP:
            raise AttachError(f"job {self.job_id}: {len(self._pending)} reports not answered by any coordinator")
        if link.reattaching and self._pending:
            self._held = True  # no coordinator to take them until the stream is back
        while self._pending and not link.reattaching:
            try:
                resp = link.report(self._pending[0])
            except AttachError as e:
                if link.gone:
                    raise
                if e.code in OUTAGE:
                    self._held = True
                    return  # kept: a re-attach (Link._read) sends them, or its end fails the rank
                if self._held and e.code == "INVALID_ARGUMENT" and _AHEAD in str(e):
                    return  # kept until the peers' reports complete the iterations before it
                raise
            self._sent.append(self._pending.popleft())
            if not self._pending:
                self._held = False
            if resp.stop:
                # after done, stop is the release (the job is over); before, a cancel
                if self._done:
                    self._released = True
                else:
                    self.cancelled = True

    def _fail(self, why: str, cause: BaseException | None = None) -> None:
        """Reports why (best effort) and raises it as AttachError."""
        self._report_error(why)
        raise AttachError(why + self._unsent) from cause

    def _report_error(self, why: str) -> None:
        """ReportRequest.error, once per agent: the job fails with it. A
        report that cannot be sent is noted in the message raised later
        (the coordinator then sees the rank as lost)."""
        if self._reported:
            return
        self._reported = True
        try:
            self._link.report(self._pb.ReportRequest(worker_id=self._link.worker_id, job_id=self.job_id,
                                                     rank=self.rank, error=why[:1000]))
        except AttachError as e:
            self._unsent = f" (not reported: {e})"

    def _drain(self) -> None:
        while (cmd := self._link.next_command(0)) is not None:
            kind = cmd.WhichOneof("kind")
            if kind == "release_job_id" and cmd.release_job_id == self.job_id:
                self.cancelled = True
            elif kind == "assign" and cmd.assign.job_id == self.job_id:
                if cmd.assign.plan_version > self.assignment.plan_version:
                    self._updates[cmd.assign.first_iteration] = cmd.assign

    def _switch_if_due(self, it: int) -> None:
        """Raises AttachError (reported at the boundary vote) when an
        update came late or cannot be built."""
        late = [k for k in self._updates if k < it]
        if late:
            raise AttachError(f"plan update for iteration {late[0]} arrived after it started (now {it})")
        new = self._updates.pop(it, None)
        if new is None:
            return
        try:
            self._sched, self._timer = _runner.build(new, self.modules, self._loss_fn, self._group, self._device)
        except Exception as e:
            raise AttachError(f"plan version {new.plan_version} ({new.schedule}) at iteration {it}: {e}") from e
        self.assignment = new

    def close(self) -> None:
        """Ends the Attach stream and the heartbeats (joins both threads)."""
        self._link.close()

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        """An exception out of the with block (the script's own: data
        loading, opt.step()) is reported as the job's error. Raised at a
        boundary (before the first iteration, or after this iteration's
        step()), the rank also casts its vote there, so its peers stop
        with an AttachError instead of waiting on it for the process
        group's timeout. Inside an iteration's communication (before its
        step()) the peers wait on it: only that timeout ends their wait."""
        try:
            if et is not None and not self._done and not self.cancelled and not self._reported:
                self._error = f"rank {self.rank}: {et.__name__}: {ev}"
                if self._boundary is not None:
                    try:
                        self._agree(self._boundary, _FAILED)
                    except AttachError:
                        pass  # the vote's verdict is this rank's own error: ev propagates
                self._report_error(self._error)
        finally:
            self.close()
        return False


def _vote(group, device: torch.device, vote: int) -> list[int]:
    """Every rank's vote, by group rank (a SUM over slots each rank fills
    alone). Bounded by the process group's timeout (init_process_group)."""
    dev = device if dist.get_backend(group) == "nccl" else torch.device("cpu")  # nccl reduces GPU tensors only
    votes = torch.zeros(dist.get_world_size(group), dtype=torch.int64, device=dev)
    votes[dist.get_rank(group)] = vote
    dist.all_reduce(votes, group=group)
    return votes.tolist()


def _build(link: Link, a: Any, stage_fn, loss_fn, group, device, wait_s: float) -> Agent:
    """The Agent, or (its stages failed to build) the failure reported,
    voted at the first boundary so the peers stop there, and raised."""
    try:
        return Agent(link, a, stage_fn, loss_fn, group, device, wait_s)
    except Exception as e:
        why = f"building rank {a.rank}'s stages: {type(e).__name__}: {e}"
        try:
            link.report(link.pb.ReportRequest(worker_id=link.worker_id, job_id=a.job_id, rank=a.rank,
                                              error=why[:1000]))
        except AttachError as re:
            why += f" (not reported: {re})"
        _vote(group, device, _FAILED)
        raise AttachError(why) from e


def attach(coordinator: str, *, run: str, stage_fn: Callable[[int], nn.Module], loss_fn: Callable,
           rank: int | None = None, worker: str | None = None, ca: str | None = None, cert: str | None = None,
           key: str | None = None, group=None, device: torch.device | str | None = None,
           wait_s: float = 600.0, heartbeat_s: float = 0.5, reattach_s: float = 60.0) -> Agent:
    """Attaches this process (torchrun rank `rank`, default the process
    group's) as the agent of (run, rank) and waits up to wait_s for its
    Assignment. With mutual TLS (ca, cert, key: a worker certificate
    zb://worker/NAME) the worker id is NAME/RANK, `worker` being NAME;
    plaintext without them (worker default: "torch-" + run). When the
    coordinator goes away (a restart, a drain) the agent attaches again
    for up to reattach_s, naming its running rank, while the loop goes on
    and its reports wait (0: the rank fails at its next boundary)."""
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
    link = Link(coordinator, req, ca=ca, cert=cert, key=key, heartbeat_s=heartbeat_s, reattach_s=reattach_s)
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
        return _build(link, a, stage_fn, loss_fn, group, device, wait_s)
    except BaseException:
        link.close()
        raise
