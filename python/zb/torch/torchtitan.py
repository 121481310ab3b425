"""torchtitan settings for a zb plan (docs/pytorch.md, torchtitan).

torchtitan (torchtitan/distributed/pipeline_parallel.py) decides which
stages a rank holds from ``pipeline_parallel_schedule``'s *name*, never from
a CSV: ZBVZeroBubble and DualPipeV place stages in a V (rank r holds r and
2p-1-r, exactly 2 per rank), every other name loops (r, r+p, ...); a
single-stage name (1F1B, GPipe, ...) means 1 stage per rank, a multi-stage
name at least 2. The number of stages comes from
``pipeline_parallel_layers_per_stage``: ceil((layers + first_less + last_less)
/ layers_per_stage) (2 per rank for a multi-stage name without it). With
``pipeline_parallel_schedule_csv`` set, torchtitan builds a
_PipelineScheduleRuntime and loads the file as a *compute-only* CSV,
lowering the sends, receives and REDUCE_GRAD itself.
"""

from __future__ import annotations

import math
from typing import Any

from .bridge import _plan_shape, compute_rows, csv_rows

# zb families PyTorch has a built-in schedule for with the same order at
# default costs, so torchtitan needs no CSV for them
_BUILTIN = {"1f1b": "1F1B", "gpipe": "GPipe"}


def _layers_per_stage(num_layers: int, n_stages: int, first_less: int, last_less: int) -> int:
    eff = num_layers + first_less + last_less
    # the smallest value that gives n_stages (ceil(eff / lps) == n_stages)
    for lps in range(max(1, math.ceil(eff / n_stages)), eff + 1):
        if math.ceil(eff / lps) == n_stages:
            return lps
    raise ValueError(f"no pipeline_parallel_layers_per_stage splits {num_layers} layers "
                     f"(+{first_less}+{last_less} for embeddings and output) into {n_stages} stages")


def torchtitan_settings(plan: Any, *, num_layers: int | None = None,
                        tokens_per_dp_rank: int | None = None, csv_path: str | None = None,
                        first_stage_less_layers: int = 1, last_stage_less_layers: int = 1) -> dict:
    """torchtitan configuration for ``plan``, as {'section.field': value}.

    - ``parallelism.pipeline_parallel_degree``: plan.ranks.
    - ``parallelism.pipeline_parallel_schedule``: a name that makes
      torchtitan place stages as the plan does: 'ZBVZeroBubble' for a V plan,
      'Interleaved1F1B' for a loop plan with chunks >= 2, and for chunks = 1
      '1F1B' / 'GPipe' (those two families with no CSV), else '1F1B'.
    - ``parallelism.pipeline_parallel_schedule_csv``: the compute-only CSV
      (plan.csv_comm()'s compute actions, written to ``csv_path`` when
      given) for every plan but plain 1f1b and gpipe; '' when none is needed.
    - ``parallelism.pipeline_parallel_layers_per_stage`` (given
      ``num_layers``): the smallest value with ceil((num_layers +
      first_stage_less_layers + last_stage_less_layers) / value) = ranks *
      chunks; None without num_layers (torchtitan then infers 1 or 2 stages
      per rank from the name, right only for chunks <= 2).
    - ``parallelism.num_pp_microbatches``: plan.microbatches.
    - ``training.num_tokens_per_microbatch_per_dp_rank`` (given
      ``tokens_per_dp_rank``, the tokens one DP rank takes per step): that
      divided by the microbatches; it must divide evenly.
    - ``csv_needed``: whether the CSV setting above is required.
    """
    p, v, m, placement = _plan_shape(plan)
    n = p * v
    is_v = v == 2 and placement == [s if s < p else 2 * p - 1 - s for s in range(n)]
    is_loop = placement == [s % p for s in range(n)]
    if not (is_v or is_loop):
        raise ValueError(f"torchtitan places stages in a loop or (2 chunks) a V; this plan's "
                         f"placement {placement} is neither")
    family = str(getattr(plan, "schedule", "") or "").lower()
    if is_v and p > 1:
        name = "ZBVZeroBubble"
    elif v >= 2:
        name = "Interleaved1F1B"
    else:
        name = _BUILTIN.get(family, "1F1B")
    csv_needed = not (v == 1 and family in _BUILTIN)
    out: dict[str, Any] = {
        "parallelism.pipeline_parallel_degree": p,
        "parallelism.pipeline_parallel_schedule": name,
        "parallelism.pipeline_parallel_schedule_csv": "",
        "parallelism.pipeline_parallel_layers_per_stage": None,
        "parallelism.num_pp_microbatches": m,
        "csv_needed": csv_needed,
    }
    if num_layers is not None:
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        out["parallelism.pipeline_parallel_layers_per_stage"] = _layers_per_stage(
            num_layers, n, first_stage_less_layers, last_stage_less_layers)
        if first_stage_less_layers != 1:
            out["parallelism.pipeline_parallel_first_stage_less_layers"] = first_stage_less_layers
        if last_stage_less_layers != 1:
            out["parallelism.pipeline_parallel_last_stage_less_layers"] = last_stage_less_layers
    elif v > 2:
        raise ValueError(f"the plan has {v} chunks per rank; torchtitan only gets there through "
                         "pipeline_parallel_layers_per_stage: pass num_layers")
    if tokens_per_dp_rank is not None:
        if tokens_per_dp_rank % m:
            raise ValueError(f"tokens_per_dp_rank {tokens_per_dp_rank} is not a multiple of the "
                             f"plan's {m} microbatches")
        out["training.num_tokens_per_microbatch_per_dp_rank"] = tokens_per_dp_rank // m
    if csv_needed and csv_path is not None:
        rows = compute_rows(csv_rows(plan.csv_comm()))
        with open(csv_path, "w") as f:
            f.write("\n".join(",".join(r) for r in rows) + "\n")
        out["parallelism.pipeline_parallel_schedule_csv"] = csv_path
    return out


def torchtitan_toml(settings: dict) -> str:
    """The settings as TOML sections for a torchtitan job file."""
    sections: dict[str, list[str]] = {}
    for key, val in settings.items():
        if "." not in key or val is None:
            continue
        sec, field = key.split(".", 1)
        lit = ("true" if val else "false") if isinstance(val, bool) else (
            f'"{val}"' if isinstance(val, str) else str(val))
        sections.setdefault(sec, []).append(f"{field} = {lit}")
    return "\n".join(f"[{s}]\n" + "\n".join(lines) + "\n" for s, lines in sections.items())
