"""zb.torch.profile_p2p on gloo with 3 processes: every rank gets the
same T_comm, a 16 MiB tensor takes longer than a 1 KiB one (a relation
with a 16384x size ratio, not a wall-clock bound), a rank outside the
pair only meets the others at the barrier, and bad ranks are refused."""

import os
import socket
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchtest import need_torch  # noqa: E402

need_torch()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 3


def worker(rank, port, q):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        from zb.torch import profile_p2p
        small = profile_p2p(torch.empty(256), src=0, dst=2, reps=10)
        big = profile_p2p(torch.empty(4 << 20), src=0, dst=2, reps=5)
        refused = []
        for kw in ({"src": 1, "dst": 1}, {"src": 0, "dst": WORLD}):
            try:
                profile_p2p(torch.empty(4), **kw)
            except ValueError as e:
                refused.append(str(e))
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, (small, big, refused)))
    except Exception:
        q.put((rank, traceback.format_exc()))


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for r, res in got.items():
        assert not isinstance(res, str), f"rank {r}:\n{res}"
    small, big, refused = got[0]
    assert all(got[r][:2] == (small, big) for r in range(WORLD)), got  # broadcast from src
    assert 0 < small < big, (small, big)
    assert len(refused) == 2 and "two ranks of the group" in refused[0], refused
    print(f"profile_p2p: 1 KiB {small * 1e6:.1f} us, 16 MiB {big * 1e6:.1f} us one way; bad ranks refused")


if __name__ == "__main__":
    main()
