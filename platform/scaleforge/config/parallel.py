"""How a training job splits its model across workers (``parallel``)."""

from typing import Literal, Optional

from pydantic import PositiveInt

from scaleforge.config.train_run import _Section


class ParallelSpec(_Section):
    """How the model is split across workers (data parallel by default).

    The degrees multiply to ``scaling.num_workers``; ``TrainJobConfig`` checks the layout once,
    before Ray starts. Supported: each of ``fsdp``, ``tp``, ``pp`` alone or with ``dp``, and
    ``fsdp`` with ``tp``; ``ep`` with ``dp``.
    """

    dp: Optional[PositiveInt] = None
    """Data-parallel replicas. Default: the workers left after ``fsdp * tp * pp``."""
    fsdp: PositiveInt = 1
    """Fully-sharded data parallel (FSDP2 ``fully_shard``): parameters, gradients and optimiser
    state split over this many workers, each training on its own data."""
    tp: PositiveInt = 1
    """Tensor parallel (transformer): attention heads and feed-forward columns split over this
    many workers (Megatron layout, DTensor ``parallelize_module``)."""
    pp: PositiveInt = 1
    """Pipeline parallel (transformer): consecutive layers split into this many stages."""
    pp_schedule: Literal["gpipe", "1f1b"] = "1f1b"
    """Pipeline schedule: ``gpipe`` (all forwards, then all backwards) or ``1f1b`` (interleaved,
    fewer activations held)."""
    microbatches: PositiveInt = 4
    """Micro-batches per pipeline step; must divide ``optim.batch_size``."""
    ep: PositiveInt = 1
    """Expert-parallel degree (MoE models): each group of ``ep`` workers splits the experts."""
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    """Recompute each transformer layer's activations in backward instead of keeping them: ``full``
    keeps only a layer's input, ``selective`` also keeps matmul and attention outputs
    (:mod:`scaleforge.models.recompute`)."""
