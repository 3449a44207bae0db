"""Training losses beyond plain cross-entropy."""

import torch
import torch.nn.functional as F


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                      temperature: float, alpha: float) -> torch.Tensor:
    """Hinton et al. 2015: ``alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE(student, labels)``.

    The T^2 factor keeps the soft term's gradients on the same scale as the hard term's when T changes.
    """
    soft = F.kl_div(F.log_softmax(student_logits / temperature, dim=1), F.log_softmax(teacher_logits / temperature, dim=1),
                    reduction="batchmean", log_target=True)
    return alpha * temperature ** 2 * soft + (1.0 - alpha) * F.cross_entropy(student_logits, labels)
