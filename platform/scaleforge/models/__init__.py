"""Model registry: a model is chosen by the ``name`` field of its spec.

Model files hold architecture only (no Ray, no training code). The specs themselves live in
:mod:`scaleforge.config.models` (no torch), so configs validate without importing this package;
they are re-exported here.
"""

from typing import Callable

from torch import nn

from scaleforge.config.models import (
    MODEL_NAMES,
    MODEL_SPEC,
    CNN1dSpec,
    MLPSpec,
    ModelSpec,
    MoEGateSpec,
    MoESpec,
    TransformerLMSpec,
    TransformerSpec,
)
from scaleforge.models.cnn1d import CNN1d
from scaleforge.models.mlp import MLP
from scaleforge.models.moe import MoEClassifier
from scaleforge.models.moe_parts import MoEGate
from scaleforge.models.transformer import TransformerClassifier
from scaleforge.models.transformer_lm import TransformerLM

_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "mlp": MLP,
    "cnn1d": CNN1d,
    "transformer": TransformerClassifier,
    "moe": MoEClassifier,
    "moe_gate": MoEGate,
    "transformer_lm": TransformerLM,
}
assert tuple(_BUILDERS) == MODEL_NAMES, "every spec in scaleforge.config.models needs a builder here"


def build_model(spec, input_dim: int, num_classes: int) -> nn.Module:
    """Instantiate the registered model that ``spec`` names.

    Args:
        spec: One of the registered specs (``MLPSpec``, ``CNN1dSpec``, ``TransformerSpec``, ...).
        input_dim: Length of one input vector (a language model's: its sequence length).
        num_classes: Number of output logits (a language model's: its vocabulary).

    Returns:
        A freshly initialised ``nn.Module`` mapping ``[batch, input_dim]`` to ``[batch, num_classes]``
        (a language model: token ids ``[batch, tokens]`` to ``[batch, tokens, vocab]``).
    """
    if spec.name not in _BUILDERS:
        raise ValueError(f"unknown model {spec.name!r}; registered models: {', '.join(MODEL_NAMES)}")
    return _BUILDERS[spec.name](spec, input_dim, num_classes)


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters in ``model``."""
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "ModelSpec",
    "MODEL_NAMES",
    "MODEL_SPEC",
    "build_model",
    "count_parameters",
    "MLPSpec",
    "CNN1dSpec",
    "TransformerSpec",
    "MoESpec",
    "MoEGateSpec",
    "TransformerLMSpec",
]
