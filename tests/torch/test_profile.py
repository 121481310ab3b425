"""zb.torch.profile on a 4-stage CPU model whose stage 2 is 4x as wide
(docs/pytorch.md). Asserts relations, never absolute times: stage 2's T_F,
T_B and T_W exceed stage 1's and stage 3's, its M_F too; M_F > 0, M_W <= 0
and M_F + M_B + M_W = 0 for every stage; stage 0 has no B (PyTorch's
runtime runs its whole backward as W); the --stage-costs text is accepted by
zbctl plan --schedule zb-auto, and bad input is refused with its name."""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchtest import need_torch, zbctl_path  # noqa: E402

need_torch()
import torch  # noqa: E402
from torch import nn  # noqa: E402

from zb.torch import profile  # noqa: E402

D, BATCH = 256, 128
WIDTHS = [512, 512, 2048, 512]  # stage 2 is 4x as wide: 4x the flops and activations


def block(w):
    return nn.Sequential(nn.Linear(D, w), nn.ReLU(), nn.Linear(w, D))


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    mods = [block(w) for w in WIDTHS]
    for p in mods[1].parameters():
        p.grad = torch.full_like(p, 7.0)  # a grad the profiler must give back
    target = torch.randn(BATCH, D)
    res = profile(mods, torch.randn(BATCH, D), loss_fn=lambda out: nn.functional.mse_loss(out, target),
                  warmup=2, reps=5)
    for k, s in enumerate(res.stages):
        print(f"stage {k} (width {WIDTHS[k]}): T_F {s.t_f*1e3:.3f} ms  T_B {s.t_b*1e3:.3f} ms  "
              f"T_W {s.t_w*1e3:.3f} ms  M_F {s.m_f}  M_B {s.m_b}  M_W {s.m_w}")
    st = res.stages
    assert res.memory_method == "saved-tensors", res.memory_method
    assert len(st) == 4
    for name in ("t_f", "t_b", "t_w", "m_f"):
        big = getattr(st[2], name)
        for k in (1, 3):
            small = getattr(st[k], name)
            assert big > small, f"{name}: stage 2 (4x wide) {big} <= stage {k} {small}"
    for k, s in enumerate(st):
        assert s.m_f > 0, f"stage {k}: M_F {s.m_f} <= 0"
        assert s.m_w <= 0, f"stage {k}: M_W {s.m_w} > 0"
        assert s.m_f + s.m_b + s.m_w == 0, f"stage {k}: deltas sum to {s.m_f + s.m_b + s.m_w}"
        assert s.t_f > 0 and s.t_w > 0, f"stage {k}: {s}"
    # stage 0 as PyTorch runs it: no input backward, the whole backward in W
    assert st[0].m_b == 0 and st[0].t_b < st[0].t_w, st[0]
    # saved activations: stage 1 keeps its input (BATCH*D) and the ReLU output (BATCH*w), float32
    assert st[1].m_f == 4 * BATCH * (D + WIDTHS[1]), st[1].m_f
    mf, mb, mw = res.mem()
    assert mf == 1 and mw <= 0 and abs(mf + mb + mw) < 1e-12, (mf, mb, mw)
    for p in mods[1].parameters():
        assert torch.equal(p.grad, torch.full_like(p, 7.0)), "profile changed a module's .grad"
    assert all(p.grad is None for p in mods[2].parameters()), "profile left gradients behind"

    text = res.stage_costs_text()
    lines = [l for l in text.splitlines() if not l.startswith("#")]
    assert len(lines) == 4 and all(len(l.split(",")) == 3 for l in lines), text
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    try:
        r = subprocess.run([zbctl_path(), "plan", "--schedule", "zb-auto", "--ranks", "4",
                            "--microbatches", "8", "--stage-costs", f.name, "--mem", res.mem_text()],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"zbctl refused the profiler's costs: {r.stderr}"
        assert "makespan" in r.stdout
    finally:
        os.unlink(f.name)

    for bad, want in (([], "stage_modules is empty"), ([mods[0], "x"], "stage_modules[1]")):
        try:
            profile(bad, torch.randn(BATCH, D))
        except (ValueError, TypeError) as e:
            assert want in str(e), e
        else:
            raise AssertionError(f"profile accepted {bad!r}")
    try:
        profile(mods, torch.randn(BATCH, D), reps=0)
    except ValueError as e:
        assert "reps" in str(e)
    else:
        raise AssertionError("reps=0 accepted")
    print("ok")


if __name__ == "__main__":
    main()
