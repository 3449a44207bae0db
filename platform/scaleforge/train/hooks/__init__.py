"""Training hooks: what rides along a run without the loop knowing (torchtitan's and Lightning's callbacks).

A hook is a :class:`TrainHook` subclass in a file of its own. The driver builds the default hooks
from the job config (:func:`default_hooks`) and adds any that the caller passes to
``run_training(cfg, hooks=[...])``; Ray ships them to every worker, so keep them small and
picklable (plain fields, no open handles).
"""

from scaleforge.train.hooks.base import Hooks, TrainHook, WorkerContext
from scaleforge.train.hooks.distill import Distillation, distillation_loss
from scaleforge.train.hooks.expert_load import ExpertLoad
from scaleforge.train.hooks.fault import KillWorker
from scaleforge.train.hooks.moe_parts import ExportMoEParts
from scaleforge.train.hooks.token_distill import TokenDistillation


def default_hooks(cfg) -> list[TrainHook]:
    """The hooks a :class:`~scaleforge.config.TrainJobConfig` asks for by itself."""
    hooks: list[TrainHook] = [ExpertLoad()]
    if cfg.fault.kill_worker_at_epoch is not None:
        hooks.append(KillWorker(cfg.fault.kill_worker_at_epoch))
    if cfg.model.name == "moe" and cfg.model.num_blocks == 1:
        hooks.append(ExportMoEParts())
    return hooks


__all__ = [
    "Distillation",
    "ExpertLoad",
    "ExportMoEParts",
    "Hooks",
    "KillWorker",
    "TokenDistillation",
    "TrainHook",
    "WorkerContext",
    "default_hooks",
    "distillation_loss",
]
