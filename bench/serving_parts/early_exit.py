"""The early-exit network of bench/serving.py: the teacher's architecture with a side exit after its
first conv block, trained on both exits' joint loss (BranchyNet) and saved as a ``cnn1d_early_exit``
artifact; the bench prints its accuracy against the share answered at the side exit beside the
two-model cascade's (held out).

Every use of ``scaleforge.models.early_exit`` by the benchmark is in this file."""

import sys

import torch

from scaleforge.artifacts import save_artifact
from scaleforge.artifacts.servable import load_servable
from scaleforge.models import CNN1dEarlyExitSpec, build_model
from scaleforge.models.early_exit import joint_loss
from scaleforge.quickfit import fit
from serving_parts.common import CACHE, EXIT_AFTER, TEACHER

SPEC = CNN1dEarlyExitSpec(**TEACHER.model_dump(exclude={"name"}), exit_after=EXIT_AFTER, exit_hidden=64)


def exit_logits(path: str, inputs: torch.Tensor) -> list[torch.Tensor]:
    """Both exits' logits (the side exit's, the final exit's) for ``inputs``."""
    return load_servable(path).module.exit_logits(inputs)


def trained_early_exit(data) -> str:
    """The network trained as ``fit_and_save`` trains the teacher, with the joint loss of both exits
    (cached): its artifact folder."""
    path = CACHE / f"early-exit-artifact-{EXIT_AFTER}"
    if not (path / "manifest.json").is_file():
        print(f"training the early-exit network (cached in {path}) ...", file=sys.stderr, flush=True)
        torch.manual_seed(0)
        model = fit(
            build_model(SPEC, 40, 10),
            data["x"],
            data["y"],
            epochs=3,
            batch_size=256,
            lr=3e-3,
            weight_decay=1e-4,
            one_cycle=True,
            loss=joint_loss,
        )
        save_artifact(path, model.eval(), SPEC, input_dim=40, num_classes=10)
    return str(path)
