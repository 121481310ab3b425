"""Worked example: profile a PyTorch model's stages, plan with zb-auto from
the measured costs, run the plan with zb.torch.schedule, compare the
measured iteration time with zb's predicted makespan. CPU, gloo.

    torchrun --nproc_per_node 2 examples/torch_pipeline/train.py

See README.md in this directory.
"""

import argparse
import copy
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

import zb
import zb.torch as zbt


def make_model(n_stages, d, widths):
    torch.manual_seed(0)
    return nn.ModuleList(
        nn.Sequential(nn.Linear(d, w), nn.GELU(), nn.Linear(w, d), nn.LayerNorm(d)) for w in widths[:n_stages])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--microbatch-size", type=int, default=64)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup-steps", type=int, default=3)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    m, mbs, d = args.microbatches, args.microbatch_size, args.dim
    # unequal stages on purpose: the last is twice as wide, so zb-auto has
    # something to balance
    widths = [4 * d] * (p - 1) + [8 * d]
    model = make_model(p, d, widths)
    loss_fn = nn.functional.mse_loss

    # 1. profile every stage on rank 0 (one microbatch); every rank plans
    # from the same measured costs (planning is deterministic)
    box = [None]
    if rank == 0:
        target = torch.randn(mbs, d)
        prof = zbt.profile([copy.deepcopy(s) for s in model], torch.randn(mbs, d),
                           loss_fn=lambda out: loss_fn(out, target))
        print(prof.stage_costs_text(), end="")
        print(f"# mem (M_F,M_B,M_W, units of M_F; {prof.memory_method}): {prof.mem_text()}")
        box[0] = (prof.stage_costs_text(), prof.stage_costs("ms"), prof.mem())
    dist.broadcast_object_list(box, src=0)
    _, stage_ms, mem = box[0]
    # T_comm: one microbatch's activation between two ranks over gloo
    comm_ms = 1e3 * zbt.profile_p2p(torch.empty(mbs, d))
    plan = zb.plan("zb-auto", p, m, stage_costs=stage_ms, costs=(1, 1, 1, comm_ms), mem=mem)
    blind = zb.plan("zb-auto", p, m, stage_costs=stage_ms, mem=mem)
    if rank == 0:
        print(f"# T_comm {comm_ms:.4f} ms (profile_p2p, {mbs}x{d} fp32)")
        print(f"planned in-process: {plan.schedule}, p={p} m={m}; predicted makespan {plan.figures.makespan:.2f} ms "
              f"({blind.figures.makespan:.2f} ms with T_comm = 0)")

    # 2. the schedule for this rank's stages
    sched = zbt.schedule(plan, rank, lambda s: copy.deepcopy(model[s]), loss_fn=loss_fn)
    mine = zbt.stages_of(plan, rank)
    opt = torch.optim.SGD([q for st in sched._stages for q in st.submod.parameters()], lr=0.05)

    # 3. train: a fixed regression task, so the loss falls
    g = torch.Generator().manual_seed(1)
    x = torch.randn(m * mbs, d, generator=g)
    y = torch.tanh(x @ torch.randn(d, d, generator=g) / d ** 0.5)
    times = []
    for step in range(args.steps):
        losses = []
        dist.barrier()
        t0 = time.perf_counter()
        sched.step(*((x,) if 0 in mine else ()), target=y if (p - 1) in mine else None, losses=losses)
        dist.barrier()
        dt = time.perf_counter() - t0
        opt.step()
        opt.zero_grad()
        if step >= args.warmup_steps:
            times.append(dt)
        if losses:
            print(f"step {step:2d}  loss {torch.stack(losses).mean().item():.5f}  iteration {dt*1e3:.1f} ms")

    t = torch.tensor([statistics.median(times)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        pred, bubble = plan.figures.makespan, plan.figures.bubble_ratio
        print(f"measured iteration (median of {len(times)}, slowest rank): {t.item()*1e3:.2f} ms; "
              f"zb predicted makespan: {pred:.2f} ms (ratio {t.item()*1e3/pred:.2f}); "
              f"predicted bubble ratio {bubble:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
