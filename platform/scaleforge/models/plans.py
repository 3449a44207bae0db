"""Each model family's parallel plan: which modules split how (the strategies stay model-agnostic).

- transformer, transformer_lm: Megatron layout for tensor parallelism (each layer's query/key/value and first
  feed-forward projection column-wise, so attention heads are split across ranks; the attention
  output and second feed-forward projection row-wise: one all-reduce each); pipeline stages of
  consecutive layers; every layer its own FSDP unit; MoE feed-forward layers for expert parallelism.
  The language model's tied embedding lives on its first and last pipeline stage, its gradient
  summed between them (Megatron's embedding group);
- moe: its MoE blocks for expert parallelism;
- mlp, cnn1d, moe_gate, cnn1d_early_exit: data parallelism and FSDP as one unit (``DENSE``).

Each family's registration (:mod:`scaleforge.models.families`) names its plan.
"""

from torch import nn

from scaleforge.distributed.plan import ParallelPlan
from scaleforge.models.moe import moe_layers

_COLUMNWISE = ("attention.query", "attention.key", "attention.value", "ff_in")
_ROWWISE = ("attention.out", "ff_out")


def transformer_tensor_plan(model: nn.Module) -> dict:
    """Column-wise in, row-wise out in every encoder layer; embedding, norms and head replicated."""
    # Imported here: torch.distributed.tensor costs 0.8 s of CPU (sympy), which a job's pre-flight
    # need not pay.
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for name in model.layers:
        plan.update({f"layers.{name}.{linear}": ColwiseParallel() for linear in _COLUMNWISE})
        plan.update({f"layers.{name}.{linear}": RowwiseParallel() for linear in _ROWWISE})
    return plan


def stage_layers(num_layers: int, stages: int) -> list[range]:
    """Consecutive layers per pipeline stage, as even as possible (earlier stages get the extra)."""
    bounds = [round(i * num_layers / stages) for i in range(stages + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(stages)]


def tied_embedding(model: nn.Module) -> list[str]:
    """The token embedding, when it is also the output projection (a language model without a head)."""
    return ["embed.weight"] if model.head is None else []


def transformer_stage(model: nn.Module, stage: int, stages: int) -> nn.Module:
    """Reduce ``model`` in place to pipeline stage ``stage`` of ``stages``.

    The stage keeps its layers under their original names (so checkpoints of all stages together
    form the full state dict); the first stage keeps the embeddings, the last the norm and head, and
    the token embedding too when it is the head's weight (``position`` marks the stage that takes
    the input).
    """
    kept = stage_layers(len(model.layers), stages)[stage]
    for name in list(model.layers):
        if int(name) not in kept:
            del model.layers[name]
    last = stage == stages - 1
    if stage > 0:
        model.position = None
        if not (last and tied_embedding(model)):
            model.embed = None
    if not last:
        model.norm, model.head = None, None
    return model


def _layers(model: nn.Module) -> list[nn.Module]:
    return list(model.layers.values())


TRANSFORMER = ParallelPlan(
    tensor_parallel=transformer_tensor_plan,
    pipeline_stage=transformer_stage,
    fsdp_units=_layers,
    expert_layers=moe_layers,
)
TRANSFORMER_LM = ParallelPlan(
    tensor_parallel=transformer_tensor_plan,
    pipeline_stage=transformer_stage,
    fsdp_units=_layers,
    expert_layers=moe_layers,
    tied_parameters=tied_embedding,
)
MOE = ParallelPlan(expert_layers=moe_layers)
