"""zb.torch.torchtitan_settings (docs/pytorch.md): for zbctl plans, the
schedule name places stages as the plan does (torchtitan's own rule: V for
ZBVZeroBubble/DualPipeV, else loop), layers_per_stage yields p*v stages by
torchtitan's formula, the written CSV equals zbctl's compute-only CSV, and
bad input is refused with its name. No process group needed."""

import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchtest import need_torch  # noqa: E402

need_torch()

import zb  # noqa: E402
from zb.torch import torchtitan_settings, torchtitan_toml  # noqa: E402


def titan_stages(name, p, n_stages, rank):
    # torchtitan's _get_pp_rank_to_stage_indices_mapping, restated
    if name in ("ZBVZeroBubble", "DualPipeV"):
        return sorted((rank, n_stages - 1 - rank))
    return [rank + s * p for s in range(n_stages // p)]


def main():
    layers = 30
    cases = [("1f1b", 2, None, "1F1B", False), ("gpipe", 4, None, "GPipe", False),
             ("zb-h1", 4, None, "1F1B", True), ("zb-v", 4, None, "ZBVZeroBubble", True),
             ("interleaved-1f1b", 2, 4, "Interleaved1F1B", True)]
    for fam, p, chunks, name, csv_needed in cases:
        plan = zb.plan(fam, p, 8, chunks=chunks)
        d = tempfile.mkdtemp()
        path = os.path.join(d, "s.csv")
        s = torchtitan_settings(plan, num_layers=layers, tokens_per_dp_rank=8 * 2048, csv_path=path)
        n = p * plan.chunks
        assert s["parallelism.pipeline_parallel_schedule"] == name, (fam, s)
        assert s["csv_needed"] is csv_needed, (fam, s)
        assert s["parallelism.pipeline_parallel_degree"] == p
        assert s["parallelism.num_pp_microbatches"] == 8
        assert s["training.num_tokens_per_microbatch_per_dp_rank"] == 2048
        lps = s["parallelism.pipeline_parallel_layers_per_stage"]
        assert math.ceil((layers + 2) / lps) == n, (fam, lps, n)
        for r in range(p):
            want = [st for st, rr in enumerate(plan.placement) if rr == r]
            assert titan_stages(name, p, n, r) == want, (fam, r, want)
        if csv_needed:
            assert s["parallelism.pipeline_parallel_schedule_csv"] == path
            with open(path) as f:
                assert f.read().split() == plan.csv().split(), f"{fam}: CSV differs from the plan's csv()"
        else:
            assert not os.path.exists(path) and s["parallelism.pipeline_parallel_schedule_csv"] == ""
        toml = torchtitan_toml(s)
        assert f'pipeline_parallel_schedule = "{name}"' in toml and "[training]" in toml, toml
        print(fam, p, name, "layers_per_stage", lps, "csv" if csv_needed else "no csv")

    plan = zb.plan("zb-h1", 2, 6)
    for kwargs, want in (({"tokens_per_dp_rank": 100}, "multiple of the plan's 6"),
                         ({"num_layers": 0}, "num_layers")):
        try:
            torchtitan_settings(plan, **kwargs)
        except ValueError as e:
            assert want in str(e), e
        else:
            raise AssertionError(f"accepted {kwargs}")
    try:
        torchtitan_settings(zb.plan("interleaved-1f1b", 2, 8, chunks=4))
    except ValueError as e:
        assert "num_layers" in str(e), e
    else:
        raise AssertionError("4 chunks without num_layers accepted")
    print("ok")


if __name__ == "__main__":
    main()
