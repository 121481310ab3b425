"""zb for PyTorch users (docs/pytorch.md): measure stage costs, run a zb plan
as a torch.distributed.pipelining schedule, derive torchtitan settings."""

from .bridge import PlanError, add_reduce_grad, compute_rows, csv_rows, schedule, stages_of
from .comm import profile_p2p
from .profiler import ProfileResult, StageCost, profile

__all__ = ["profile", "profile_p2p", "ProfileResult", "StageCost", "schedule", "stages_of", "PlanError",
           "add_reduce_grad", "compute_rows", "csv_rows"]
from .torchtitan import torchtitan_settings, torchtitan_toml  # noqa: E402

__all__ += ["torchtitan_settings", "torchtitan_toml"]
from .agent import Agent, attach  # noqa: E402
from ._wire import AttachError  # noqa: E402

__all__ += ["attach", "Agent", "AttachError"]
