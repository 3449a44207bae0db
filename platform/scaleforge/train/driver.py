"""The training driver: build the ``TorchTrainer``, run it, export the model as an artifact."""

import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

from scaleforge import storage
from scaleforge.artifacts import save_artifact
from scaleforge.config.schema import TrainJobConfig
from scaleforge.data import localized
from scaleforge.data.ray_datasets import TrainingData, build_ray_datasets
from scaleforge.distributed.checkpoint import read_trainer_state
from scaleforge.distributed.memory import describe_memory
from scaleforge.distributed.strategy import strategy_for
from scaleforge.models import build_model, count_parameters
from scaleforge.progress import ProgressChannel
from scaleforge.runtime import ensure_ray
from scaleforge.text.tokenizer import ByteTokenizer
from scaleforge.train.hooks import TrainHook, default_hooks
from scaleforge.train.hooks.throughput import throughput_hook
from scaleforge.train.loop import WorkerRun, train_loop_per_worker
from scaleforge.train.preflight import check_runnable
from scaleforge.train.run_files import checkpoint_location, loss_curve, step_log

_REPORTED = ("test_accuracy", "test_loss", "train_accuracy", "train_loss", "bits_per_byte")


@dataclass
class TrainingResult:
    """What a finished training run produced."""

    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    artifact: Path
    checkpoint_path: str
    loss_curve: Optional[str]
    """The loss-curve PNG in the run's folder (with ``run.log_every_steps``)."""
    num_workers: int
    num_parameters: int
    wall_s: float
    notes: list[str]
    """The hooks' summary lines."""
    step_log: list[dict[str, Any]] = field(default_factory=list)
    """With ``run.checkpoint_every_steps``: every optimiser step every attempt took, in order (step,
    epoch, loss, global batch, workers, and the step the attempt resumed from), as sent by one rank."""

    def repeated_steps(self) -> int:
        """Steps of the step log that ran more than once (lost with a worker, run again after a restart)."""
        return len(self.step_log) - len({entry["step"] for entry in self.step_log})

    def _recovery(self) -> list[str]:
        """What the summary says about restarts and an elastic group's sizes."""
        lines = []
        if len(sizes := sorted({entry["workers"] for entry in self.step_log})) > 1:
            rows = sorted({entry["global_batch"] for entry in self.step_log})
            lines.append(
                f"elastic group: steps ran on {' and '.join(map(str, sizes))} workers, "
                f"global batch {' and '.join(map(str, rows))} rows"
            )
        if self.metrics.get("resumed_from_step"):
            lines.append(
                f"resumed from the checkpoint of step {self.metrics['resumed_from_step']} after a restart "
                f"({self.repeated_steps()} steps run twice)"
            )
        elif self.metrics.get("resumed_from_epoch"):
            lines.append(
                f"resumed from the checkpoint of epoch {self.metrics['resumed_from_epoch']} after a failure"
            )
        return lines

    def summary(self) -> str:
        after = (
            f"after {len(self.history)} epochs on {self.num_workers} workers, {self.wall_s:.1f} s wall-clock"
        )
        if "bits_per_byte" in self.metrics:
            quality = (
                f"validation bits/byte {self.metrics['bits_per_byte']:.3f} "
                f"(loss {self.metrics['test_loss']:.4f} per token, "
                f"{self.metrics['tokens_per_s']:,.0f} tokens/s)"
            )
        else:
            quality = (
                f"test accuracy {self.metrics['test_accuracy']:.4f} (loss {self.metrics['test_loss']:.4f})"
            )
        lines = [f"{quality} {after}", *self.notes]
        if "memory_per_worker" in self.metrics:
            lines.append(describe_memory(self.metrics))
        lines += self._recovery()
        lines.append(f"artifact: {self.artifact} ({self.num_parameters:,} parameters)")
        lines.append(f"checkpoints: {self.checkpoint_path}")
        if self.loss_curve:
            lines.append(f"loss curve: {self.loss_curve}")
        return "\n".join(lines)


def run_training(
    cfg: TrainJobConfig, *, data: Optional[TrainingData] = None, hooks: Sequence[TrainHook] = ()
) -> TrainingResult:
    """Train ``cfg.model`` on Ray Train with the layout ``cfg.parallel`` and export it as an artifact.

    Args:
        cfg: A validated job config.
        data: Prebuilt datasets (default: built from ``cfg.data``).
        hooks: Hooks to run besides the ones ``cfg`` asks for
            (e.g. :class:`~scaleforge.train.hooks.Distillation`).

    Returns:
        The final metrics, the per-epoch history and the artifact folder.
    """
    started = time.perf_counter()
    check_runnable(cfg)
    dims, scaling = cfg.dims, cfg.scaling
    hooks = [*default_hooks(cfg), *hooks]
    for hook in hooks:
        hook.check(dims)
    ensure_ray(
        min_cpus=scaling.num_workers * scaling.resources_per_worker.get("CPU", 1) + 2,
        min_memory=scaling.num_workers * scaling.resources_per_worker.get("memory", 0),
    )
    data = data or build_ray_datasets(cfg.data)
    if cfg.run.log_every_steps:
        hooks.append(throughput_hook(cfg, data.info, cfg.global_slices))
    strategy = strategy_for(dims)
    run_name = cfg.run.name or f"train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    progress = ProgressChannel.shared()
    progress.records = []  # the shared channel's records are this run's
    trainer = _trainer(cfg, data, hooks, strategy.data_config(cfg.ordered_batches), run_name, progress)
    with progress.printing():
        result = trainer.fit()
    with result.checkpoint.as_directory() as folder:
        state = read_trainer_state(Path(folder))
        model = strategy.gather(
            Path(folder), build_model(cfg.model, data.info.input_dim, data.info.num_classes)
        )
    artifact = _export(
        cfg, data, hooks, model, state, {"run": run_name, "checkpoint": result.checkpoint.path}
    )
    metrics = {
        **state["history"][-1],
        "resumed_from_epoch": state["resumed_from_epoch"],
        "resumed_from_step": state["resumed_from_step"] if cfg.ordered_batches else 0,
        **state.get("memory", {}),
    }
    return TrainingResult(
        metrics=metrics,
        history=state["history"],
        artifact=artifact,
        checkpoint_path=checkpoint_location(cfg.run.storage_path, run_name, result.checkpoint.path),
        loss_curve=loss_curve(cfg.run.storage_path, run_name, result.checkpoint.path, state),
        num_workers=scaling.num_workers,
        num_parameters=count_parameters(model),
        wall_s=time.perf_counter() - started,
        notes=[line for hook in hooks for line in hook.summary(metrics)],
        step_log=step_log(cfg.run.storage_path, run_name, result.checkpoint.path, progress.records),
    )


class _Trainer(TorchTrainer):
    """``TorchTrainer`` without Ray Train 2.60's placement-group cleaner: a detached actor per run that
    asks Ray's state API every second whether the run's controller lives and removes the run's placement
    group when the answer is no. Twice in fresh-clone suite runs it got that answer about a live
    controller (its log: 7 and 11 failed queries, then "controller ... is dead") and killed the run's workers,
    which cost a restart of the run. The placement group stays scoped to the driver, as Ray scopes one
    an actor creates: a job's driver exits with its run."""

    def _create_default_callbacks(self):
        return [
            c for c in super()._create_default_callbacks() if not isinstance(c, PlacementGroupCleanerCallback)
        ]


def _trainer(
    cfg: TrainJobConfig, data: TrainingData, hooks, dataset_config, run_name: str, progress
) -> TorchTrainer:
    """Ray Train's trainer for the run: every worker runs :func:`train_loop_per_worker`."""
    scaling = cfg.scaling
    return _Trainer(
        train_loop_per_worker,
        train_loop_config={"run": WorkerRun(cfg, cfg.dims, asdict(data.info), hooks, progress)},
        scaling_config=ScalingConfig(
            num_workers=(scaling.min_workers, scaling.num_workers)
            if scaling.elastic
            else scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker=dict(scaling.resources_per_worker),
            elastic_resize_monitor_interval_s=scaling.resize_interval_s,
        ),
        # On GPUs, CUDA tensors go over NCCL and the loop's small CPU totals over gloo.
        torch_config=TorchConfig(backend="cpu:gloo,cuda:nccl" if scaling.use_gpu else "gloo"),
        run_config=RunConfig(
            name=run_name,
            storage_path=storage.normalize(
                cfg.run.storage_path
            ),  # a URI goes to Ray's (pyarrow) storage layer
            failure_config=FailureConfig(max_failures=cfg.run.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.run.keep_checkpoints),
            logging_config=LoggingConfig(log_level=cfg.run.log_level),
        ),
        datasets=data.datasets,
        dataset_config=dataset_config,
    )


def _export(cfg: TrainJobConfig, data: TrainingData, hooks, model, state: dict, run: dict[str, str]) -> Path:
    """Write the trained ``model`` as an artifact, with what the hooks export beside it
    (``run``: the run's name and final checkpoint)."""
    final = state["history"][-1]
    shapes = {
        "input_dim": data.info.input_dim,
        "num_classes": data.info.num_classes,
        "dataset": {
            "source": localized(cfg.data).source,
            "fingerprint": data.fingerprint,
            **asdict(data.info),
        },
    }
    training = {
        "job": "train",
        **run,
        "num_workers": cfg.scaling.num_workers,
        "epochs": len(state["history"]),
        "parallel": cfg.dims.to_dict(),
    }
    extra = {"tokenizer": (data.tokenizer or ByteTokenizer()).to_json()} if data.info.tokens else {}
    for hook in hooks:
        entries = hook.export(cfg.artifact.dir, model, cfg.model, **shapes)
        training.update(entries.pop("training", {}))
        extra.update(entries)
    return save_artifact(
        cfg.artifact.dir,
        model,
        cfg.model,
        metrics={k: final[k] for k in _REPORTED if k in final},
        extra={"training": training, **extra},
        **shapes,
    )
