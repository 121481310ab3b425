"""zb.torch.schedule against non-pipelined training (docs/pytorch.md).

For each plan (zbctl: 1f1b, zb-h1, interleaved-1f1b, zb-v at p = 2, and
zb-h1, zb-v at p = 4), p CPU processes on gloo build their stages with
zb.torch.schedule and run one step; every stage's parameter gradients must
equal those of the whole model on the whole batch (float64, relative
tolerance 1e-9). A control run without the REDUCE_GRAD the bridge inserts
must come out m times too large, which shows the comparison can fail.
"""

import copy
import os
import socket
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchtest import need_torch  # noqa: E402

need_torch()

import zb  # noqa: E402
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

D, BATCH, M, RTOL = 16, 8, 4, 1e-9


def build_model(n_stages):
    torch.manual_seed(1234)
    return torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh()) for _ in range(n_stages)
    ).double()


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)


def data():
    g = torch.Generator().manual_seed(99)
    return (torch.randn(BATCH, D, generator=g, dtype=torch.float64),
            torch.randn(BATCH, D, generator=g, dtype=torch.float64))


def reference_grads(n_stages):
    model = build_model(n_stages)
    x, y = data()
    h = x
    for blk in model:
        h = blk(h)
    loss_fn(h, y).backward()
    return [[p.grad.clone() for p in blk.parameters()] for blk in model]


def run_one(plan, rank, add_reduce_grad):
    from zb.torch import schedule, stages_of

    n = plan.ranks * plan.chunks
    model = build_model(n)
    sched = schedule(plan, rank, lambda s: copy.deepcopy(model[s]), loss_fn=loss_fn,
                     add_missing_reduce_grad=add_reduce_grad)
    mine = stages_of(plan, rank)
    x, y = data()
    kwargs = {"target": y} if (n - 1) in mine else {}
    args = (x,) if 0 in mine else ()
    sched.step(*args, **kwargs)
    ref = reference_grads(n)
    ratios = []
    for st in sched._stages:
        for p, g in zip(st.submod.parameters(), ref[st.stage_index]):
            if p.grad is None:
                raise AssertionError(f"{plan.schedule}: stage {st.stage_index} has no gradient")
            ratios.append(float(p.grad.norm() / g.norm()))
            if add_reduce_grad and not torch.allclose(p.grad, g, rtol=RTOL, atol=1e-12):
                err = float((p.grad - g).abs().max())
                raise AssertionError(f"{plan.schedule} p={plan.ranks}: stage {st.stage_index} "
                                     f"gradient differs from the non-pipelined one by {err:.3g}")
    return ratios


class WithoutReduceGrad:
    """A plan whose csv-comm lacks REDUCE_GRAD and WAIT_REDUCE_GRAD (as
    zbctl wrote it before they were added)."""

    def __init__(self, plan):
        self.plan = plan
        self.schedule, self.ranks, self.chunks = plan.schedule, plan.ranks, plan.chunks
        self.microbatches, self.placement = plan.microbatches, plan.placement

    def csv_comm(self):
        rows = [[c for c in line.split(",") if "REDUCE_GRAD" not in c] for line in self.plan.csv_comm().splitlines()]
        assert all(rows), "a row held only reductions"
        return "".join(",".join(r) + "\n" for r in rows)


def worker(rank, world, port, plans, q):
    try:
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
        out = []
        for plan in plans:
            run_one(plan, rank, True)
            out.append((plan.schedule, "ok"))
        # a csv-comm from elsewhere without REDUCE_GRAD: the bridge inserts
        # them and the gradients are right; left out, they are m times too
        # large (the control that shows the comparison can fail)
        bare = WithoutReduceGrad(plans[0])
        run_one(bare, rank, True)
        control = run_one(bare, rank, False)
        out.append(("control", control))
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, out))
    except Exception:
        q.put((rank, traceback.format_exc()))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(p, schedules):
    plans = [zb.plan(s, p, M) for s in schedules]
    for pl in plans:
        if any(pl.placement.count(r) != pl.chunks for r in range(p)):
            raise AssertionError(f"{pl.schedule}: adapter placement {pl.placement}")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, p, port, plans, q)) for r in range(p)]
    for pr in procs:
        pr.start()
    results = {}
    try:
        for _ in range(p):
            rank, res = q.get(timeout=240)  # a hung peer fails here, not forever
            results[rank] = res
            if isinstance(res, str):  # one rank failed: its peers may wait on it forever
                break
    finally:
        for pr in procs:
            pr.join(timeout=10)
            if pr.is_alive():
                pr.kill()
    failed = {r: v for r, v in results.items() if isinstance(v, str)}
    if failed:
        for r, v in failed.items():
            print(f"rank {r}:\n{v}")
        raise AssertionError(f"p={p}: ranks {sorted(failed)} failed")
    for r, res in results.items():
        control = dict(res)["control"]
        if not all(abs(c - M) < 1e-6 * M for c in control):
            raise AssertionError(f"p={p} rank {r}: control gradient ratios {control}, expected {M}")
    print(f"p={p}: {', '.join(schedules)}: gradients equal to non-pipelined (rtol {RTOL}); "
          f"control without REDUCE_GRAD is {M}x")


def test_add_reduce_grad_rows():
    from zb.torch.bridge import add_reduce_grad, compute_rows, csv_rows
    rows = csv_rows("0F0,0F1,0I0,0W0,1RECV_B0,0I1,0W1\n1F0,(1F1;1B0)OVERLAP_F_B,1B1\n")
    got = add_reduce_grad(rows, 2)
    assert got[0][-3:] == ["0W1", "0REDUCE_GRAD", "0WAIT_REDUCE_GRAD"], got[0]
    assert got[1][-3:] == ["1B1", "1REDUCE_GRAD", "1WAIT_REDUCE_GRAD"], got[1]
    assert add_reduce_grad(got, 2) == got  # already present: unchanged
    assert compute_rows(rows)[0] == ["0F0", "0F1", "0I0", "0W0", "0I1", "0W1"]


def test_bad_plans():
    from zb.torch.bridge import PlanError, stages_of

    class P:
        ranks, chunks, microbatches = 2, 2, 4
        placement = [0, 1, 1, 1]

        def csv_comm(self):
            return ""
    try:
        stages_of(P(), 0)
    except PlanError as e:
        assert "rank 0 1 stages" in str(e), e
    else:
        raise AssertionError("a placement giving rank 0 one of two stages was accepted")
    P.placement = [0, 1, 1, 0]
    assert stages_of(P(), 0) == [0, 3] and stages_of(P(), 1) == [1, 2]


if __name__ == "__main__":
    test_add_reduce_grad_rows()
    test_bad_plans()
    run_group(2, ["1f1b", "zb-h1", "interleaved-1f1b", "zb-v"])
    if os.environ.get("ZB_TORCH_P4", "1") != "0":
        run_group(4, ["zb-h1", "zb-v"])
    print("ok")
