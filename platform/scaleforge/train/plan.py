"""Memory per device of every parallel layout of a job, computed without allocating a tensor.

``python -m jobs.train --config ... --plan`` prints this table. The model is built on PyTorch's
``meta`` device (shapes, no storage) and cut with the model family's own parallel plan, so the
count follows the code that trains it: tensor parallelism splits the modules its plan names
(column-wise: weight rows and bias; row-wise: weight columns), pipeline parallelism keeps each
stage's parameters (a tied embedding on the first and the last stage), FSDP divides everything.

Per parameter element, one device holds the fp32 weight, its fp32 gradient and the optimiser's
state (AdamW: two fp32 moments; SGD: one momentum buffer). Activations are an estimate for a
pre-norm decoder layer in fp32 (Korthikanti et al. 2022, without sequence parallelism, with a
fused attention kernel that keeps no ``tokens x tokens`` matrix): per token and layer, ``6 d``
kept whole on every tensor-parallel rank (norm inputs and outputs, residuals) plus ``(4 d + 2 ff)
/ tp`` (query, key, value, attention output, the feed-forward hidden layer before and after its
activation), plus the logits and their gradient on the last stage. A pipeline stage holds the
activations of as many micro-batches as its schedule keeps in flight (GPipe: all, 1F1B: ``pp``).
Activation checkpointing keeps less: ``full`` a layer's input ``d`` (and one layer's whole activations
while it recomputes), ``selective`` its input and the outputs of its matmuls, ``3 d + (4 d + ff) / tp``.

Besides the model's state, a worker holds communication buffers: FSDP gathers a unit's whole fp32
parameters (the unit computing and the next, prefetched) and its whole gradient before reducing it;
DDP keeps a second copy of the gradients in its buckets. And a worker process holds its runtime
(Python, torch, gloo and Ray's worker, or a GPU's CUDA context), :data:`RUNTIME`.
"""

import copy
import math
from dataclasses import dataclass

import torch

from scaleforge.config.loader import ConfigError
from scaleforge.config.schema import TrainJobConfig
from scaleforge.data.preflight import check_data
from scaleforge.distributed.dims import ParallelDims
from scaleforge.models import build_model, model_family
from scaleforge.train.layouts import layouts

_GIB = 2**30
_FP32 = 4
RUNTIME = _GIB // 2
"""What a training worker process holds besides the model: measured on these machines, a Ray Train
worker of ``train_lm_small.yaml`` peaks at 561 MiB with 13 MiB of model state (``bench/lm.py``'s layouts)."""


@dataclass(frozen=True)
class LayoutMemory:
    """Bytes one device holds under a layout (the fullest device: pipeline stages differ)."""

    dims: ParallelDims
    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int = 0
    """Communication buffers: FSDP's gathered units, DDP's gradient buckets."""
    runtime: int = RUNTIME

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers + self.runtime


def layout_memory(cfg: TrainJobConfig, dims: ParallelDims, input_dim: int, num_classes: int) -> LayoutMemory:
    """What the fullest device holds when ``cfg``'s model trains under ``dims``.

    Raises:
        ConfigError: the model family cannot be split the way ``dims`` asks.
    """
    with torch.device("meta"):
        model = build_model(cfg.model, input_dim, num_classes)
    plan = model_family(cfg.model.name).plan
    if (dims.tp_enabled and plan.tensor_parallel is None) or (
        dims.pp_enabled and plan.pipeline_stage is None
    ):
        raise ConfigError(f"{dims.describe()}: model.name={cfg.model.name} has no such parallel plan")
    shards = _tensor_shards(model, plan, dims.tp)
    stages = (
        [model]
        if not dims.pp_enabled
        else [plan.pipeline_stage(copy.deepcopy(model), s, dims.pp) for s in range(dims.pp)]
    )
    elements = max(
        sum(math.ceil(p.numel() / shards.get(name, 1)) for name, p in stage.named_parameters())
        for stage in stages
    )
    elements = math.ceil(elements / dims.fsdp)
    optimizer_copies = 2 if cfg.optim.optimizer == "adamw" else 1
    return LayoutMemory(
        dims,
        elements * _FP32,
        elements * _FP32,
        optimizer_copies * elements * _FP32,
        _activations(cfg, dims, input_dim, num_classes),
        _buffers(model, plan, shards, dims, elements),
    )


def _buffers(model, plan, shards: dict[str, int], dims: ParallelDims, elements: int) -> int:
    """FSDP: the largest unit's whole parameters twice (computing, prefetched) and its whole gradient;
    DDP (data parallelism alone): its buckets' copy of the gradients."""
    if dims.fsdp > 1:
        units = plan.fsdp_units(model) or [model]
        prefix = {id(module): name for name, module in model.named_modules()}

        def size(unit) -> int:
            names = (f"{prefix[id(unit)]}.{n}".lstrip(".") for n, _ in unit.named_parameters())
            return sum(math.ceil(p.numel() / shards.get(n, 1)) for n, p in zip(names, unit.parameters()))

        return 3 * max(size(unit) for unit in units) * _FP32
    if dims.data_world > 1 and not (dims.tp_enabled or dims.pp_enabled or dims.ep > 1):
        return elements * _FP32
    return 0


def _tensor_shards(model, plan, tp: int) -> dict[str, int]:
    """``{parameter name: ranks it is split over}`` under the family's tensor-parallel plan."""
    if tp == 1:
        return {}
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # see models.plans

    shards = {}
    for module_name, style in plan.tensor_parallel(model).items():
        if isinstance(style, ColwiseParallel):
            shards.update({f"{module_name}.weight": tp, f"{module_name}.bias": tp})
        elif isinstance(style, RowwiseParallel):
            shards[f"{module_name}.weight"] = tp
    return shards


def _activations(cfg: TrainJobConfig, dims: ParallelDims, tokens: int, vocab: int) -> int:
    model, batch = cfg.model, cfg.optim.batch_size
    width, hidden, layers = (
        getattr(model, "d_model", 0),
        getattr(model, "ff_dim", 0),
        getattr(model, "num_layers", 0),
    )
    if not layers:  # not a transformer: its activations are small next to its state
        return 0
    kept = (6 * width + (4 * width + 2 * hidden) / dims.tp) * _FP32  # per token and layer, none recomputed
    layers_here = math.ceil(layers / dims.pp)
    recompute = cfg.parallel.activation_checkpointing
    if recompute == "full":  # each layer's input, and one layer's whole activations while it recomputes
        kept = width * _FP32 + kept / layers_here
    elif recompute == "selective":  # its input, the matmul and attention outputs
        kept = (3 * width + (4 * width + hidden) / dims.tp) * _FP32
    rows = batch
    if dims.pp_enabled:
        micro = batch // dims.microbatches
        rows = micro * (dims.microbatches if dims.pp_schedule == "gpipe" else min(dims.pp, dims.microbatches))
    logits = 2 * batch * tokens * vocab * _FP32
    return int(rows * tokens * layers_here * kept + logits)


def memory_plan(cfg: TrainJobConfig, input_dim: int, num_classes: int) -> tuple[str, list[LayoutMemory]]:
    """The table ``--plan`` prints (the job's own layout first, then every other one) and its rows."""
    rows = [layout_memory(variant, variant.dims, input_dim, num_classes) for variant in layouts(cfg)]
    device = cfg.scaling.device_memory_gb
    header = (
        f"{'layout':<24}{'params':>10}{'grads':>10}{'optimizer':>11}{'activations':>13}{'buffers':>9}"
        f"{'runtime':>9}{'total GiB':>11}  fits"
    )
    with torch.device("meta"):
        parameters = sum(p.numel() for p in build_model(cfg.model, input_dim, num_classes).parameters())
    lines = [
        f"memory per device (GiB), {cfg.model.name} of {parameters / 1e6:,.1f}M parameters, "
        f"{cfg.scaling.describe()} workers, batch "
        f"{cfg.optim.batch_size} x {input_dim} per data rank"
        + (f", {device:g} GB each" if device else " (no scaling.device_memory_gb declared)"),
        header,
    ]
    for index, row in enumerate(rows):
        fits = "-" if not device else ("yes" if row.total <= device * 1e9 else "NO")
        lines.append(
            f"{row.dims.describe():<24}{row.params / _GIB:>10.2f}{row.grads / _GIB:>10.2f}"
            f"{row.optimizer / _GIB:>11.2f}{row.activations / _GIB:>13.2f}{row.buffers / _GIB:>9.2f}"
            f"{row.runtime / _GIB:>9.2f}{row.total / _GIB:>11.2f}  {fits}"
            + ("  <- this job" if index == 0 else "")
        )
    if cfg.scaling.elastic:
        lines.append(_smallest_size(cfg, input_dim, num_classes))
    return "\n".join(lines), rows


def _smallest_size(cfg: TrainJobConfig, input_dim: int, num_classes: int) -> str:
    """The line for an elastic group at the smallest size of its range."""
    smallest = cfg.scaling.min_workers
    row = layout_memory(cfg, cfg.dims_at(smallest), input_dim, num_classes)
    accumulated = math.ceil(cfg.global_slices / row.dims.data_world)
    return (
        f"elastic {cfg.scaling.describe()}: at {smallest} worker{'s' if smallest > 1 else ''} "
        f"({row.dims.describe()}) each device holds {row.total / _GIB:.2f} GiB, a rank running up to "
        f"{accumulated} slices of "
        f"{cfg.optim.batch_size} rows per step so the global batch stays "
        f"{cfg.optim.batch_size * cfg.global_slices}"
    )


def check_fits(cfg: TrainJobConfig, input_dim: int, num_classes: int) -> None:
    """Refuse the job's layout when its fullest device needs more than ``scaling.device_memory_gb``.

    Raises:
        ConfigError: naming the layout, what it needs and what the device has.
    """
    device = cfg.scaling.device_memory_gb
    if not device:
        return
    need = layout_memory(cfg, cfg.dims, input_dim, num_classes)
    if need.total > device * 1e9:
        raise ConfigError(
            f"parallel: layout {cfg.dims.describe()} needs {need.total / 1e9:.1f} GB per device "
            f"(params {need.params / 1e9:.1f}, grads {need.grads / 1e9:.1f}, optimizer "
            f"{need.optimizer / 1e9:.1f}, activations {need.activations / 1e9:.1f}, buffers "
            f"{need.buffers / 1e9:.1f}, runtime {need.runtime / 1e9:.1f}), more than "
            f"scaling.device_memory_gb ({device:g}); see --plan for layouts that fit"
        )


def print_plan(cfg: TrainJobConfig) -> None:
    """``jobs.train --plan``'s pre-flight: print the memory table of ``cfg``'s layouts (stdout), from
    the data's shape alone.

    Raises:
        ConfigError: the data cannot be read, or the job's own layout does not fit its devices.
    """
    info = check_data(cfg.data)
    table, _ = memory_plan(cfg, info.input_dim, info.num_classes)
    print(table, flush=True)
    check_fits(cfg, info.input_dim, info.num_classes)


def plan_verdict(cfg: TrainJobConfig) -> str:
    """``jobs.train --plan``'s last line, once :func:`print_plan` found that the job's layout fits."""
    info = check_data(cfg.data)
    need = layout_memory(cfg, cfg.dims, info.input_dim, info.num_classes).total / 1e9
    device = cfg.scaling.device_memory_gb
    return f"layout {cfg.dims.describe()} needs {need:.1f} GB per device" + (
        f", within scaling.device_memory_gb ({device:g})" if device else ""
    )
