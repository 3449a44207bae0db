"""Training on Ray Train: ``TorchTrainer`` + DDP, Ray Data shards, resumable checkpoints.

The same loop runs expert parallelism (``parallel.ep``) and model parallelism (``parallel.fsdp``,
``tp``, ``pp``: :mod:`scaleforge.distributed.model_parallel`); ``_parallelize`` builds the layout.
"""

import logging
import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydantic import TypeAdapter
from ray.train import (
    Checkpoint,
    CheckpointConfig,
    CheckpointConsistencyMode,
    DataConfig,
    FailureConfig,
    LoggingConfig,
    RunConfig,
    ScalingConfig,
)
from ray.train.torch import TorchConfig, TorchTrainer

from scaleforge.artifacts import save_artifact
from scaleforge.artifacts.parts import save_moe_parts
from scaleforge.config.schema import FaultSpec, OptimSpec, ParallelSpec, RunSpec, TrainJobConfig
from scaleforge.data.ray_datasets import TrainingData, build_ray_datasets
from scaleforge.distributed.checkpoint import (
    load_model_weights,
    load_optimizer_state,
    read_trainer_state,
    save_model_state,
    save_optimizer_state,
    write_trainer_state,
)
from scaleforge.distributed.ep import expert_groups, gather_expert_state, shard_experts, sync_gradients
from scaleforge.distributed.memory import describe_memory, gather_memory, single_process_memory
from scaleforge.distributed.model_parallel import ModelParallel, load_gathered_weights, parallelize
from scaleforge.distributed.losses import distillation_loss
from scaleforge.distributed.schedule import learning_rate_at, peak_learning_rate
from scaleforge.distributed.worker_data import WorkerData
from scaleforge.models import ModelSpec, build_model, count_parameters
from scaleforge.models.moe import auxiliary_loss, expert_load, moe_layers
from scaleforge.runtime import ensure_ray

_MODEL_SPEC = TypeAdapter(ModelSpec)
_log = logging.getLogger(__name__)


@dataclass
class TrainingResult:
    """What a finished data-parallel run produced."""

    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    artifact: Path
    checkpoint_path: str
    num_workers: int
    num_parameters: int
    wall_s: float

    def summary(self) -> str:
        lines = [
            f"test accuracy {self.metrics['test_accuracy']:.4f} (loss {self.metrics['test_loss']:.4f}) "
            f"after {len(self.history)} epochs on {self.num_workers} workers, {self.wall_s:.1f} s wall-clock"
        ]
        if "expert_load_cv" in self.metrics:
            lines.append(f"expert load: cv {self.metrics['expert_load_cv']:.3f}, busiest expert "
                         f"{self.metrics['expert_max_over_mean']:.2f}x the mean, dropped "
                         f"{self.metrics['expert_dropped_fraction']:.2%} (counts {self.metrics['expert_counts']})")
        if "memory_per_worker" in self.metrics:
            lines.append(describe_memory(self.metrics))
        if self.metrics.get("resumed_from_epoch"):
            lines.append(f"resumed from the checkpoint of epoch {self.metrics['resumed_from_epoch']} after a failure")
        lines.append(f"artifact: {self.artifact} ({self.num_parameters:,} parameters)")
        lines.append(f"checkpoints: {self.checkpoint_path}")
        return "\n".join(lines)


def run_training(cfg: TrainJobConfig, *, data: Optional[TrainingData] = None,
                 distill: Optional[dict[str, float]] = None) -> TrainingResult:
    """Train ``cfg.model`` data-parallel on Ray Train and export the model as an artifact.

    Args:
        cfg: A validated job config.
        data: Prebuilt datasets (default: built from ``cfg.data``).
        distill: ``{"temperature", "alpha"}``: train on the soft targets in the train split's
            ``teacher_logits`` column plus the hard labels (knowledge distillation).

    Returns:
        The final metrics, the per-epoch history and the artifact folder.
    """
    started = time.perf_counter()
    scaling = cfg.scaling
    ensure_ray(min_cpus=scaling.num_workers * scaling.resources_per_worker.get("CPU", 1) + 2)
    data = data or build_ray_datasets(cfg.data)
    run_name = cfg.run.name or f"train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"job": cfg.model_dump(mode="json"), "info": asdict(data.info), "distill": distill},
        scaling_config=ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker=dict(scaling.resources_per_worker),
        ),
        torch_config=TorchConfig(backend="nccl" if scaling.use_gpu else "gloo"),
        run_config=RunConfig(
            name=run_name,
            storage_path=_storage_uri(cfg.run),
            failure_config=FailureConfig(max_failures=cfg.run.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.run.keep_checkpoints),
            logging_config=LoggingConfig(log_level=cfg.run.log_level),
        ),
        datasets=data.datasets,
        dataset_config=_data_config(cfg.parallel),
    )
    result = trainer.fit()
    with result.checkpoint.as_directory() as folder:
        state = read_trainer_state(Path(folder))
        model = build_model(cfg.model, data.info.input_dim, data.info.num_classes)
        if cfg.parallel.model_parallel:  # sharded checkpoint: gathered here, in one process
            load_gathered_weights(Path(folder), model)
        else:
            model.load_state_dict(load_model_weights(Path(folder)))
    final = state["history"][-1]
    dataset = {"source": cfg.data.source, "fingerprint": data.fingerprint, **asdict(data.info)}
    parts = {}
    if cfg.model.name == "moe" and cfg.model.num_blocks == 1:
        parts = {"moe_parts": save_moe_parts(cfg.artifact.dir, model, cfg.model, input_dim=data.info.input_dim,
                                             num_classes=data.info.num_classes, dataset=dataset)}
    artifact = save_artifact(
        cfg.artifact.dir,
        model,
        cfg.model,
        input_dim=data.info.input_dim,
        num_classes=data.info.num_classes,
        metrics={k: final[k] for k in ("test_accuracy", "test_loss", "train_accuracy", "train_loss")},
        dataset=dataset,
        extra={"training": {"job": "train", "run": run_name, "checkpoint": result.checkpoint.path,
                            "num_workers": scaling.num_workers, "epochs": len(state["history"]),
                            "parallel": cfg.parallel.model_dump(), **({"distill": distill} if distill else {})},
                            **parts},
    )
    return TrainingResult(
        metrics={**final, "resumed_from_epoch": state["resumed_from_epoch"], **state.get("memory", {})},
        history=state["history"],
        artifact=artifact,
        checkpoint_path=result.checkpoint.path,
        num_workers=scaling.num_workers,
        num_parameters=count_parameters(model),
        wall_s=time.perf_counter() - started,
    )


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: one DDP rank of the run.

    Resumes from ``ray.train.get_checkpoint()`` when the worker group was restarted; reports
    metrics every epoch and a checkpoint (from rank 0) every ``run.checkpoint_every`` epochs.
    """
    job, info = config["job"], config["info"]
    optim, run, fault = OptimSpec(**job["optim"]), RunSpec(**job["run"]), FaultSpec(**job["fault"])
    logging.getLogger("ray.train").setLevel(run.log_level)  # per-report INFO lines drown the progress
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(job["scaling"]["resources_per_worker"].get("CPU", 1))))
    torch.manual_seed(optim.seed)

    model = build_model(_MODEL_SPEC.validate_python(job["model"]), info["input_dim"], info["num_classes"])
    reference_memory = single_process_memory(model, optim.optimizer)
    parallel = ParallelSpec(**job["parallel"])
    checkpoint = ray.train.get_checkpoint()
    start_epoch, step, history, memory = 0, 0, [], {}
    if checkpoint:
        with checkpoint.as_directory() as folder:
            if not parallel.model_parallel:  # full weights load before any sharding
                model.load_state_dict(load_model_weights(Path(folder)))
            state = read_trainer_state(Path(folder))
        start_epoch, step, history, memory = state["epoch"] + 1, state["step"], state["history"], state.get("memory", {})
    layout = _parallelize(model, parallel, rank, device)
    module = layout.module
    optimizer = _make_optimizer(module, optim)
    if checkpoint:  # each rank takes its own optimiser (and, model-parallel, weight) shard
        with checkpoint.as_directory() as folder:
            if layout.split:
                layout.split.load(Path(folder), optimizer)
            else:
                load_optimizer_state(Path(folder), optimizer, layout.optimizer_shard)

    data = WorkerData(layout.split, optim, info, world, distill=bool(config.get("distill")))
    peak = peak_learning_rate(optim.lr, optim.batch_size * data.world, optim.base_batch_size, optim.lr_scaling)
    schedule = dict(peak=peak, total_steps=data.steps_per_epoch * optim.epochs,
                    warmup_steps=round(optim.warmup_epochs * data.steps_per_epoch), schedule=optim.schedule)

    for epoch in range(start_epoch, optim.epochs):
        # Injected fault: the last rank dies halfway through this epoch, on the first attempt only.
        dies_now = fault.kill_worker_at_epoch == epoch + 1 and start_epoch == 0 and rank == world - 1
        began = time.perf_counter()
        for layer in moe_layers(module):
            layer.reset_stats()
        train, step, lr = _train_epoch(layout, optimizer, data.train_batches(epoch), optim, schedule, step, epoch,
                                       die_at_batch=data.steps_per_epoch // 2 if dies_now else -1,
                                       distill=config.get("distill"))
        elapsed = torch.tensor([time.perf_counter() - began])
        if layout.split and not memory:  # after the first step every gradient and optimiser state exists
            memory = gather_memory(layout.split.memory(optimizer), reference_memory)
            if rank == 0:
                _log.info(describe_memory(memory))
        test = _evaluate(layout, data.test_batches(), data.eval_batch, device, optim.precision == "bf16")
        if world > 1:
            for totals in (train, test):
                dist.all_reduce(totals)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        metrics = {
            "epoch": epoch + 1,
            "train_loss": (train[0] / train[2]).item(),
            "train_accuracy": (train[1] / train[2]).item(),
            "test_loss": (test[0] / test[2]).item(),
            "test_accuracy": (test[1] / test[2]).item(),
            "lr": lr,
            "samples_per_s": train[2].item() / elapsed.item(),
            "epoch_s": elapsed.item(),
            "resumed_from_epoch": start_epoch,
            **_expert_load(module),
        }
        history.append(metrics)
        if rank == 0:
            _log.info(
                f"[train] epoch {epoch + 1}/{optim.epochs}  loss {metrics['train_loss']:.4f}  "
                f"train_acc {metrics['train_accuracy']:.4f}  test_acc {metrics['test_accuracy']:.4f}  "
                f"lr {lr:.2e}  {metrics['samples_per_s']:,.0f} samples/s  ({metrics['epoch_s']:.1f}s)"
                + (f"  expert load cv {metrics['expert_load_cv']:.3f} dropped {metrics['expert_dropped_fraction']:.3f}"
                   if "expert_load_cv" in metrics else "")
            )
        _report(metrics, epoch, optim.epochs, run.checkpoint_every, rank, layout, optimizer,
                {"epoch": epoch, "step": step, "history": history, "resumed_from_epoch": start_epoch, "memory": memory})


def _train_epoch(layout: "_Layout", optimizer, batches, optim: OptimSpec, schedule, step: int, epoch: int,
                 die_at_batch: int, distill: Optional[dict[str, float]] = None):
    """One pass over this rank's ``(x, y, teacher logits or None)`` batches.

    Returns:
        ([loss sum, correct, seen], next step, last lr).
    """
    layout.model.train()
    totals, lr = torch.zeros(3, dtype=torch.float64), 0.0
    for index, (x, y, teacher_logits) in enumerate(batches):
        if index == die_at_batch:
            # Ray Train commits a reported checkpoint when its controller next polls the workers;
            # wait for that so the crash always lands after a durable checkpoint.
            ray.train.get_all_reported_checkpoints(CheckpointConsistencyMode.COMMITTED, timeout_s=60)
            _log.warning(f"[fault] rank {dist.get_rank() if dist.is_initialized() else 0} exits in epoch "
                         f"{epoch + 1} (fault.kill_worker_at_epoch)")
            os._exit(1)
        lr = learning_rate_at(step, **schedule)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        loss, logits = layout.train_step(x, y, bf16=optim.precision == "bf16", teacher_logits=teacher_logits,
                                         distill=distill)
        optimizer.step()
        step += 1
        if logits is not None:  # model parallel: only the rank that reports for its data slice
            totals += torch.tensor([loss.item() * len(logits), (logits.argmax(1) == y).sum().item(), len(logits)])
    return totals, step, lr


def _task_loss(logits: torch.Tensor, y: torch.Tensor, teacher_logits: Optional[torch.Tensor],
               distill: Optional[dict[str, float]]) -> torch.Tensor:
    """Cross-entropy on the labels, or with ``distill`` the distillation loss on the teacher's logits too."""
    if distill:
        return distillation_loss(logits, teacher_logits, y, **distill)
    return F.cross_entropy(logits, y)


def _expert_load(module) -> dict[str, Any]:
    """Per-epoch MoE routing statistics summed over ranks (empty for dense models)."""
    layers = moe_layers(module)
    if dist.is_initialized():
        for layer in layers:
            for buffer in (layer.expert_counts, layer.dropped, layer.routed):
                dist.all_reduce(buffer)
    load = expert_load(module)
    if load is None:
        return {}
    return {"expert_counts": load["expert_counts"], "expert_load_cv": load["load_cv"],
            "expert_max_over_mean": load["max_over_mean_load"], "expert_dropped_fraction": load["dropped_fraction"]}


def _report(metrics, epoch, epochs, every, rank, layout: "_Layout", optimizer, state) -> None:
    if (epoch + 1) % every and epoch + 1 != epochs:
        ray.train.report(metrics)
        return
    writes = rank == 0 or bool(layout.optimizer_shard) or bool(layout.split)
    with tempfile.TemporaryDirectory() as folder:
        # Ray Train gathers every reporting rank's files into one checkpoint folder.
        if layout.split:  # each rank writes its own shards (DCP, collective)
            layout.split.save(Path(folder), optimizer)
        else:
            model_state = layout.full_state()  # a collective under expert parallelism: every rank calls it
            if rank == 0:  # replicated weights: one full copy is enough
                save_model_state(Path(folder), model_state)
            if writes:
                save_optimizer_state(Path(folder), optimizer, layout.optimizer_shard)
        if rank == 0:
            write_trainer_state(Path(folder), state)
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder) if writes else None)


@dataclass
class _Layout:
    """The model as this rank trains it: the wrapped model, the bare module and what the split needs."""

    model: torch.nn.Module
    module: torch.nn.Module
    full_state: Optional[Callable[[], dict[str, torch.Tensor]]] = None
    sync_gradients: Optional[Callable[[], None]] = None
    optimizer_shard: str = ""
    split: Optional[ModelParallel] = None
    """Model parallel (fsdp, tp, pp): its own step, prediction and sharded checkpoints."""

    def train_step(self, x: torch.Tensor, y: torch.Tensor, bf16: bool = False,
                   teacher_logits: Optional[torch.Tensor] = None, distill: Optional[dict[str, float]] = None):
        """Forward (autocast to bf16 if asked; model parallel is fp32 only) and backward with
        gradients synchronised. Returns ``(loss, logits)``, or ``(None, None)`` on model-parallel
        ranks that do not see the logits."""
        if self.split:
            return self.split.train_step(x, y)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = self.model(x)
            loss = _task_loss(logits.float(), y, teacher_logits, distill) + auxiliary_loss(self.module)
        loss.backward()
        if self.sync_gradients:
            self.sync_gradients()
        return loss, logits

    def predict(self, x: torch.Tensor, rows: int) -> Optional[torch.Tensor]:
        """Logits of the bare module (no gradient sync needed), ``None`` on ranks without them."""
        return self.split.predict(x, rows) if self.split else self.module(x)


def _parallelize(model: torch.nn.Module, parallel: ParallelSpec, rank: int, device: torch.device) -> _Layout:
    """DDP for replicated models; for ``parallel.ep > 1``, experts sharded with all_to_all dispatch
    and gradients averaged per replica group (DDP cannot mix sharded and replicated parameters);
    for ``fsdp``, ``tp`` or ``pp > 1``, the model split by :func:`model_parallel.parallelize`."""
    if parallel.model_parallel:
        split = parallelize(model, parallel, device)
        return _Layout(split.module, split.module, split=split)
    if parallel.ep == 1:
        wrapped = ray.train.torch.prepare_model(model)
        module = wrapped.module if hasattr(wrapped, "module") else wrapped
        return _Layout(wrapped, module, module.state_dict)
    model = ray.train.torch.prepare_model(model, parallel_strategy=None)
    groups = expert_groups(parallel.ep)
    shard_experts(model, groups)
    return _Layout(model, model, partial(gather_expert_state, model, groups),
                   partial(sync_gradients, model, groups), optimizer_shard=f".rank{rank}")


@torch.no_grad()
def _evaluate(layout: _Layout, batches, rows: int, device, bf16: bool) -> torch.Tensor:
    """[loss sum, correct, count] on this rank's test batches of at most ``rows``, using rank 0's
    BatchNorm statistics.

    (Under expert or model parallelism the forward is collective; every rank gets the same
    number of batches.)
    """
    if dist.is_initialized() and not layout.split:
        for buffer in layout.module.buffers():  # evaluate exactly the weights that get exported
            dist.broadcast(buffer, 0)
    layout.module.eval()
    totals = torch.zeros(3, dtype=torch.float64)
    for x, y in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = layout.predict(x, rows)
        if logits is not None:
            logits = logits.float()
            totals += torch.tensor([F.cross_entropy(logits, y, reduction="sum").item(),
                                    (logits.argmax(1) == y).sum().item(), len(logits)])
    return totals


def _make_optimizer(module: torch.nn.Module, optim: OptimSpec) -> torch.optim.Optimizer:
    if optim.optimizer == "sgd":
        return torch.optim.SGD(module.parameters(), lr=optim.lr, momentum=optim.momentum,
                               nesterov=True, weight_decay=optim.weight_decay)
    return torch.optim.AdamW(module.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)


def _data_config(parallel: ParallelSpec) -> DataConfig:
    """Ray Data shards per worker; under model parallelism every worker reads the whole dataset
    in one fixed order, so ranks that share a data slice can take the same rows."""
    if not parallel.model_parallel:
        return DataConfig()
    options = DataConfig.default_ingest_options()
    options.preserve_order = True
    return DataConfig(datasets_to_split=[], execution_options=options)


def _storage_uri(run: RunSpec) -> str:
    if "://" in run.storage_path:
        return run.storage_path  # s3://, gs://, ... go through Ray's (pyarrow) storage layer unchanged
    return str(Path(run.storage_path).expanduser().resolve())
