"""Model-agnostic parallelism on Ray Train. Data parallel (DDP) first."""

from scaleforge.distributed.schedule import learning_rate_at, peak_learning_rate

__all__ = ["learning_rate_at", "peak_learning_rate"]
