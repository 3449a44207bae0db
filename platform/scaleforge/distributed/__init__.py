"""Model-agnostic parallelism on Ray Train: the layout (:class:`ParallelDims`), one strategy per
parallelism (``ddp``, ``ep``, ``mesh`` behind :class:`~scaleforge.distributed.strategy.ParallelModel`),
checkpoint formats and memory accounting. Model families describe how they split in a
:class:`~scaleforge.distributed.plan.ParallelPlan`; nothing here names a model's modules."""

from scaleforge.distributed.dims import MESH_DIMS, ParallelDims

__all__ = ["MESH_DIMS", "ParallelDims"]
