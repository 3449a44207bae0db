"""Model registry: a model is chosen by the ``name`` field of its spec.

Each family is registered once (:mod:`scaleforge.models.families`) with its builder, parallel plan,
auxiliary loss and exports (:func:`model_family`); model files hold architecture only (no Ray, no
training code). The specs themselves, with each family's capabilities, live in
:mod:`scaleforge.config.models` (no torch), so configs validate without importing this package;
they are re-exported here.
"""

from torch import nn

from scaleforge.config.models import (
    MODEL_NAMES,
    MODEL_SPEC,
    CNN1dEarlyExitSpec,
    CNN1dSpec,
    MLPSpec,
    ModelSpec,
    MoEGateSpec,
    MoESpec,
    TransformerLMSpec,
    TransformerSpec,
)
from scaleforge.models import families  # noqa: F401  (registers the built-in families)
from scaleforge.models.registry import ModelFamily, model_family, register, registered

assert registered() == MODEL_NAMES, "every spec in scaleforge.config.models needs a registered family"


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
    return model_family(spec.name).build(spec, input_dim, num_classes)


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters in ``model``."""
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "ModelSpec",
    "ModelFamily",
    "MODEL_NAMES",
    "MODEL_SPEC",
    "build_model",
    "count_parameters",
    "model_family",
    "register",
    "MLPSpec",
    "CNN1dSpec",
    "CNN1dEarlyExitSpec",
    "TransformerSpec",
    "MoESpec",
    "MoEGateSpec",
    "TransformerLMSpec",
]
