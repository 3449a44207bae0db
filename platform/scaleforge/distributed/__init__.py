"""Model-agnostic parallelism on Ray Train: data (DDP), expert, and model parallel (fsdp, tp, pp)."""

from scaleforge.distributed.schedule import learning_rate_at, peak_learning_rate

__all__ = ["learning_rate_at", "peak_learning_rate"]
