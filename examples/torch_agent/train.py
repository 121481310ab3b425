"""A torchrun job as a zb job (examples/torch_agent/README.md): every
process attaches to zb-coordinator with zb.torch.attach, receives its
rank's stages and schedule, trains them with SGD and reports each
iteration, so `zbctl watch` shows loss and bubble and `zbctl
update-schedule` switches the schedule between iterations.

The model is a stack of Linear+Tanh stages in float64, one per pipeline
stage, seeded by stage index (so every placement builds the same model);
iteration i trains on batch(i), seeded by i. tests/torch/test_agent_torch.py
runs this file and compares the saved weights with a non-pipelined run.

    python -m torch.distributed.run --standalone --nproc_per_node 2 train.py \
        --coordinator 127.0.0.1:7070 --torch-run demo --out /tmp/demo
"""

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

import zb.torch

HIDDEN = 16
BATCH = 8
LR = 0.05


def make_stage(s: int) -> nn.Module:
    torch.manual_seed(100 + s)
    return nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh()).double()


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + i)
    return (torch.randn(BATCH, HIDDEN, generator=g, dtype=torch.float64),
            torch.randn(BATCH, HIDDEN, generator=g, dtype=torch.float64))


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, target)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coordinator", required=True, help="zb-coordinator's host:port")
    ap.add_argument("--torch-run", required=True, help="the job spec's torch_run")
    ap.add_argument("--out", required=True, help="directory for each rank's stage weights and its log")
    ap.add_argument("--ca"), ap.add_argument("--cert"), ap.add_argument("--key")
    ap.add_argument("--worker", help="the NAME of the worker certificate zb://worker/NAME")
    ap.add_argument("--pause-s", type=float, default=0.0,
                    help="sleep after each iteration (a tiny model's iterations are too quick to watch)")
    ap.add_argument("--pause-rank", type=int, default=-1,
                    help="only this rank sleeps (default all): a slow rank, its peers waiting on it")
    ap.add_argument("--pg-timeout-s", type=float, default=120.0,
                    help="the process group's timeout, seconds (how long a peer waits on a dead rank)")
    args = ap.parse_args()

    # a finite timeout: a rank that dies inside an iteration leaves its
    # peers waiting on it this long (PyTorch's default is 30 minutes)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout_s))
    rank = dist.get_rank()
    agent = zb.torch.attach(args.coordinator, run=args.torch_run, stage_fn=make_stage, loss_fn=mse,
                            worker=args.worker, ca=args.ca, cert=args.cert, key=args.key)
    opt = torch.optim.SGD(list(agent.parameters()), lr=LR)
    losses = {}
    with agent:
        for it in agent.iterations():
            x, y = batch(it)
            opt.zero_grad()
            loss = agent.step(x, target=y)
            opt.step()
            if loss is not None:
                losses[it] = loss
            if args.pause_rank in (-1, rank):
                time.sleep(args.pause_s)
    os.makedirs(args.out, exist_ok=True)
    for s, mod in agent.modules.items():
        torch.save(mod.state_dict(), os.path.join(args.out, f"stage{s}.pt"))
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"job_id": agent.job_id, "stages": sorted(agent.modules), "cancelled": agent.cancelled,
                   "plan_versions": agent.plan_versions, "losses": losses}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
