"""Training hooks: what rides along a run without the loop knowing (torchtitan's and Lightning's callbacks).

A hook is a :class:`TrainHook` subclass in a file of its own. The driver builds the default hooks
from the job config (:func:`default_hooks`) and adds any that the caller passes to
``run_training(cfg, hooks=[...])``; Ray ships them to every worker, so keep them small and
picklable (plain fields, no open handles).
"""

from scaleforge.train.hooks.base import Hooks, TrainHook, WorkerContext
from scaleforge.train.hooks.distill import Distillation, distillation_loss
from scaleforge.train.hooks.expert_load import ExpertLoad
from scaleforge.train.hooks.family_exports import FamilyExports
from scaleforge.train.hooks.fault import KillWorker
from scaleforge.train.hooks.token_distill import TokenDistillation


def default_hooks(cfg) -> list[TrainHook]:
    """The hooks a :class:`~scaleforge.config.TrainJobConfig` asks for by itself."""
    hooks: list[TrainHook] = [ExpertLoad(), FamilyExports()]
    fault = cfg.fault
    if fault.kill_worker_at_epoch is not None or fault.kill_worker_at_step is not None:
        hooks.append(KillWorker(fault.kill_worker_at_epoch, fault.kill_worker_at_step))
    return hooks


__all__ = [
    "Distillation",
    "ExpertLoad",
    "FamilyExports",
    "Hooks",
    "KillWorker",
    "TokenDistillation",
    "TrainHook",
    "WorkerContext",
    "default_hooks",
    "distillation_loss",
]
