"""Early exit inside one network (BranchyNet, Teerapittayanon et al. 2016).

A 1-D CNN with a side exit after its first ``exit_after`` conv blocks, registered as the family
``cnn1d_early_exit``. Both exits are trained together (the sum of their cross-entropies,
:func:`joint_loss`; in ``jobs.train`` the final exit's cross-entropy plus the family's auxiliary loss
:func:`side_exit_loss`), and at inference the network is a
cascade whose stages share computation (:meth:`EarlyExitCNN1d.predict`): every input runs the stem
and the side exit; only the inputs the side exit is not confident about (the cascade's own routing
policy, :func:`scaleforge.routing.escalate`) run the rest of the network, from the stem's feature
maps rather than from the input. Compared with a two-model cascade, the escalated inputs do not pay
a second stem, and there is one set of weights to serve.
"""

from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from scaleforge.config.models import CNN1dSpec
from scaleforge.models.cnn1d import conv_blocks
from scaleforge.routing.cascade import CascadeResult, ConfidenceMeasure, confidence, escalate

if TYPE_CHECKING:  # the strategies' module imports DTensor (0.8 s), which pre-flights need not pay
    from scaleforge.distributed.strategy import Batch


class EarlyExitCNN1d(nn.Module):
    """A :class:`~scaleforge.models.cnn1d.CNN1d` (``spec``) with a side exit after ``exit_after`` blocks.

    ``forward`` returns the final exit's logits, so the network scores and exports as any classifier
    (in training mode it keeps the side exit's logits for :func:`side_exit_loss`); :meth:`exit_logits`
    returns both exits' and :meth:`predict` runs it as a cascade. ``exit_after`` and ``exit_hidden``
    default to the spec's (a ``cnn1d_early_exit`` spec), else 1 and 64.
    """

    def __init__(
        self,
        spec: CNN1dSpec,
        input_dim: int,
        num_classes: int,
        exit_after: Optional[int] = None,
        exit_hidden: Optional[int] = None,
    ):
        super().__init__()
        exit_after = getattr(spec, "exit_after", 1) if exit_after is None else exit_after
        exit_hidden = getattr(spec, "exit_hidden", 64) if exit_hidden is None else exit_hidden
        if not 1 <= exit_after < len(spec.channels):
            raise ValueError(
                f"early exit: exit_after must be between 1 and {len(spec.channels) - 1} (the blocks "
                f"before the last of channels={spec.channels}), got {exit_after}"
            )
        blocks, channels, length = conv_blocks(
            spec.channels, spec.kernel_size, spec.pool, input_dim, "early exit", spec.batch_norm
        )
        stem, stem_channels, stem_length = conv_blocks(
            spec.channels[:exit_after], spec.kernel_size, spec.pool, input_dim, "early exit", spec.batch_norm
        )
        self.stem = nn.Sequential(*blocks[: len(stem)])  # the first blocks, as the whole network builds them
        self.rest = nn.Sequential(*blocks[len(stem) :])
        self.side = nn.Sequential(
            nn.Flatten(),
            nn.Linear(stem_channels * stem_length, exit_hidden),
            nn.ReLU(),
            nn.Linear(exit_hidden, num_classes),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * length, spec.hidden),
            nn.ReLU(),
            nn.Dropout(spec.dropout),
            nn.Linear(spec.hidden, num_classes),
        )

        self.side_logits: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.stem(x.unsqueeze(1))
        # Training keeps the side exit's logits of this forward, for the family's auxiliary loss.
        self.side_logits = self.side(features) if self.training else None
        return self.head(self.rest(features))

    def exit_logits(self, x: torch.Tensor) -> list[torch.Tensor]:
        """[side exit, final exit] logits of every input ([batch, classes] each)."""
        features = self.stem(x.unsqueeze(1))
        return [self.side(features), self.head(self.rest(features))]

    @torch.inference_mode()
    def predict(
        self, x: torch.Tensor, threshold: float, measure: ConfidenceMeasure = "max_prob"
    ) -> CascadeResult:
        """The network as a two-stage cascade: an input whose side-exit confidence is below
        ``threshold`` goes on through the rest of the network from the stem's feature maps.
        The answers equal :func:`scaleforge.routing.simulate_cascade` over both exits' probabilities
        (in eval mode every row is computed independently); only the escalated rows pay the rest."""
        features = self.stem(x.unsqueeze(1))
        probs = self.side(features).softmax(dim=-1)
        stage = torch.zeros(len(x), dtype=torch.long)
        onward = escalate(probs, threshold, measure)
        if onward.any():
            probs[onward] = self.head(self.rest(features[onward])).softmax(dim=-1)
            stage[onward] = 1
        return CascadeResult(probs, stage, confidence(probs, measure))


def joint_loss(model: EarlyExitCNN1d, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """BranchyNet's training objective: the exits' cross-entropies summed (equal weights), so the
    stem learns features that serve the side exit and the rest of the network alike."""
    return sum(F.cross_entropy(logits, labels) for logits in model.exit_logits(inputs))


def side_exit_loss(model: nn.Module, batch: "Batch") -> torch.Tensor:
    """The family's auxiliary loss: the side exit's cross-entropy from the last training forward, so
    the trainer's loss (the final exit's cross-entropy plus this) is :func:`joint_loss`."""
    (network,) = [m for m in model.modules() if isinstance(m, EarlyExitCNN1d)]
    if network.side_logits is None:
        raise RuntimeError("side_exit_loss needs a forward pass in training mode first")
    return F.cross_entropy(network.side_logits.float(), batch.y)


@torch.inference_mode()
def exit_probabilities(model: EarlyExitCNN1d, x: torch.Tensor) -> list[torch.Tensor]:
    """[side exit, final exit] class probabilities of every input: the cascade's stages, first to last."""
    return [logits.softmax(dim=-1) for logits in model.exit_logits(x)]


def export_exits(artifact_dir: str, model: EarlyExitCNN1d, spec: Any, **shapes) -> dict[str, Any]:
    """The manifest's ``exits`` entry: what a cascade over the network's own exits serves, first to last
    (the weights are the artifact's; the side exit reads the first ``exit_after`` blocks)."""
    return {"exits": {"names": ["side", "final"], "after_blocks": [spec.exit_after, len(spec.channels)]}}
