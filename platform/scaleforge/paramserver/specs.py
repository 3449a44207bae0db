"""What the parameter server's actors are built from: frozen specs, one argument each, every field named."""

from dataclasses import dataclass
from typing import Optional

import numpy as np

from scaleforge.paramserver.consistency import Async, Policy


@dataclass(frozen=True)
class ShardSpec:
    """What every ``ParameterShard`` of a run shares: its consistency mode, optimiser and checkpoints."""

    consistency: Policy
    """``Sync``, ``SSP`` or ``Async`` (``consistency.py``), with the mode's parameters."""
    num_workers: int
    """Workers at the start (each shard keeps their clocks; scaling changes them)."""
    optimizer: str
    """``sgd`` (with ``momentum``) or ``adam``: the optimiser each shard applies to its slice."""
    lr: float
    momentum: float = 0.0
    staleness_aware_lr: bool = False
    """Divide each update's step by its staleness (Zhang et al. 2016)."""
    checkpoint_dir: Optional[str] = None
    """Where each shard keeps its checkpoint (a folder or a URI); ``None``: no checkpoints."""
    checkpoint_every: int = 0
    """Updates between checkpoints (0: never)."""
    run_token: Optional[str] = None
    """Names the run's shared-memory files; ``None`` keeps the parameters in private memory."""
    rounds: Optional[int] = None
    """Modes in rounds (sync): the run's rounds. Once a shard has applied them all, a gradient still
    pushed to it (a worker steps on while another shard lags a round behind) has no round left."""


@dataclass(frozen=True)
class ReplicaSpec:
    """What one ``AsyncWorker`` is built from: its model replica, its data shard, its shards and mode."""

    index: int
    model: dict
    """The model spec (JSON), built into the replica."""
    input_dim: int
    num_classes: int
    x: np.ndarray
    """The worker's shard of the training examples."""
    y: np.ndarray
    batch_size: int
    seed: int
    """Seeds the order of the worker's batches and its simulated delays."""
    shards: tuple
    """The ``ParameterShard`` actors, in order."""
    ranges: tuple[tuple[int, int], ...]
    """Each shard's [start, stop) in the flat parameter vector."""
    consistency: Policy = Async()
    weight_prediction: bool = False
    """Compute each gradient at the parameters predicted for when it lands (``WeightPredictor``)."""
    delay_s: float = 0.0
    """Simulated persistent straggler: seconds added to every step."""
    transient_delay_s: float = 0.0
    """Simulated transient straggler: seconds added to a step with ``transient_delay_probability``."""
    transient_delay_probability: float = 0.0
    die_at_step: Optional[int] = None
    """Injected fault: the worker SIGKILLs its own process at this step."""
    run_token: Optional[str] = None
    """Names the worker's shared gradient buffer; ``None`` keeps it in private memory."""
