"""Training on Ray Train: a short driver, one worker loop, parallel strategies and hooks.

``run_training(cfg)`` builds the ``TorchTrainer``; every worker runs :func:`train_loop_per_worker`,
which trains a :class:`~scaleforge.distributed.ParallelModel` (DDP, expert parallel or a
device mesh) and lets :class:`~scaleforge.train.hooks.TrainHook` objects ride along.
"""

from scaleforge.train.driver import TrainingResult, run_training
from scaleforge.train.hooks import TrainHook

__all__ = ["TrainHook", "TrainingResult", "run_training"]
