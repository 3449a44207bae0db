"""A language model's distillation as a hook: the teacher runs on every batch, over every token."""

from dataclasses import dataclass

import torch

from scaleforge.distributed.strategy import Batch
from scaleforge.train.hooks.distill import Distillation, cached_teacher, distillation_loss


@dataclass
class TokenDistillation(Distillation):
    """A language model's distillation over every token position, the teacher run on each batch.

    A teacher's token distribution is 256 floats per token, a thousand times the text it predicts,
    so it is not precomputed as a column: each worker loads the teacher (an artifact path or URI)
    once and runs it on the batch's tokens, without gradients, inside the training step.
    """

    teacher: str
    """The teacher's artifact (folder or URI)."""
    columns = {}

    def task_loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        # no_grad, not inference_mode: the KL term's backward keeps the teacher's log-probabilities.
        with torch.no_grad():
            teacher_logits = cached_teacher(self.teacher)(batch.x)
        return distillation_loss(
            logits.flatten(0, -2),
            teacher_logits.flatten(0, -2),
            batch.y.flatten(),
            self.temperature,
            self.alpha,
        )
