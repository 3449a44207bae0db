"""The built-in model families, each registered once (:func:`scaleforge.models.registry.register`).

Adding a family is its spec (:mod:`scaleforge.config.models`: fields and capabilities, listed in
``ModelSpec``), its module here in ``models/`` (architecture, plus its plan, loss or exports if it
has any) and one ``register`` line below.
"""

from typing import TYPE_CHECKING, Any

from torch import nn

from scaleforge.config.models import (
    CNN1dEarlyExitSpec,
    CNN1dSpec,
    MLPSpec,
    MoEGateSpec,
    MoESpec,
    TransformerLMSpec,
    TransformerSpec,
)
from scaleforge.models.cnn1d import CNN1d
from scaleforge.models.early_exit import EarlyExitCNN1d, exit_probabilities, export_exits, side_exit_loss
from scaleforge.models.mlp import MLP
from scaleforge.models.moe import MoEClassifier, auxiliary_loss
from scaleforge.models.moe_parts import MoEGate
from scaleforge.models.plans import MOE, TRANSFORMER, TRANSFORMER_LM
from scaleforge.models.registry import ModelFamily, register
from scaleforge.models.transformer import TransformerClassifier
from scaleforge.models.transformer_lm import TransformerLM

if TYPE_CHECKING:  # the strategies' module imports DTensor (0.8 s), which pre-flights need not pay
    from scaleforge.distributed.strategy import Batch


def balancing_loss(model: nn.Module, batch: "Batch"):
    """Every MoE layer's load-balancing (and z-) loss from the last forward (0.0 without MoE layers)."""
    return auxiliary_loss(model)


def export_moe_parts(artifact_dir: str, model: nn.Module, spec: MoESpec, **shapes) -> dict[str, Any]:
    """A one-block MoE classifier's gate and experts as servable artifacts (``moe_parts`` in the
    manifest), which the Serve MoE router deploys one by one; deeper models have no such split."""
    if spec.num_blocks != 1:
        return {}
    from scaleforge.artifacts.parts import save_moe_parts  # artifacts build models: imported on use

    return {"moe_parts": save_moe_parts(artifact_dir, model, spec, **shapes)}


register(ModelFamily(MLPSpec, MLP))
register(ModelFamily(CNN1dSpec, CNN1d))
register(ModelFamily(TransformerSpec, TransformerClassifier, TRANSFORMER, balancing_loss))
register(ModelFamily(MoESpec, MoEClassifier, MOE, balancing_loss, export=export_moe_parts))
register(ModelFamily(MoEGateSpec, MoEGate))
register(ModelFamily(TransformerLMSpec, TransformerLM, TRANSFORMER_LM, balancing_loss))
register(
    ModelFamily(
        CNN1dEarlyExitSpec,
        EarlyExitCNN1d,
        auxiliary_loss=side_exit_loss,
        export=export_exits,
        exit_probabilities=exit_probabilities,
    )
)
