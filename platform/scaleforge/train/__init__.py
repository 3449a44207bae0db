"""Training on Ray Train: a short driver, one worker loop, parallel strategies and hooks.

``run_training(cfg)`` builds the ``TorchTrainer``; every worker runs
:func:`~scaleforge.train.loop.train_loop_per_worker`, which trains a
:class:`~scaleforge.distributed.strategy.ParallelModel` (DDP, expert parallel or a device mesh)
and lets :class:`~scaleforge.train.hooks.TrainHook` objects ride along.
"""

from scaleforge.lazy import lazy_exports

__all__ = ["TrainHook", "TrainingResult", "run_training"]
__getattr__ = lazy_exports(
    __name__,
    {
        "TrainHook": "scaleforge.train.hooks",
        "TrainingResult": "scaleforge.train.driver",
        "run_training": "scaleforge.train.driver",
    },
)
