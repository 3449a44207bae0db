"""Model registry: a model is chosen by the ``name`` field of its spec.

Model files hold architecture only (no Ray, no training code). ``ModelSpec`` is the tagged union
of every registered spec, so a config with an unknown name fails validation with the list of
names that exist.
"""

from typing import Annotated, Callable, Union

from pydantic import Field
from torch import nn

from scaleforge.models.cnn1d import CNN1d, CNN1dSpec
from scaleforge.models.mlp import MLP, MLPSpec
from scaleforge.models.moe import MoEClassifier, MoESpec
from scaleforge.models.moe_parts import MoEGate, MoEGateSpec
from scaleforge.models.transformer import TransformerClassifier, TransformerSpec

ModelSpec = Annotated[Union[MLPSpec, CNN1dSpec, TransformerSpec, MoESpec, MoEGateSpec], Field(discriminator="name")]

_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "mlp": MLP,
    "cnn1d": CNN1d,
    "transformer": TransformerClassifier,
    "moe": MoEClassifier,
    "moe_gate": MoEGate,
}
MODEL_NAMES = tuple(_BUILDERS)


def build_model(spec, input_dim: int, num_classes: int) -> nn.Module:
    """Instantiate the registered model that ``spec`` names.

    Args:
        spec: One of the registered specs (``MLPSpec``, ``CNN1dSpec``, ``TransformerSpec``).
        input_dim: Length of one input vector.
        num_classes: Number of output logits.

    Returns:
        A freshly initialised ``nn.Module`` mapping ``[batch, input_dim]`` to ``[batch, num_classes]``.
    """
    if spec.name not in _BUILDERS:
        raise ValueError(f"unknown model {spec.name!r}; registered models: {', '.join(MODEL_NAMES)}")
    return _BUILDERS[spec.name](spec, input_dim, num_classes)


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters in ``model``."""
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "ModelSpec", "MODEL_NAMES", "build_model", "count_parameters", "MLPSpec", "CNN1dSpec", "TransformerSpec", "MoESpec",
]
