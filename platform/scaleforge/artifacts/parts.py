"""Export an MoE model's gate and experts as separate artifacts, for routers that host each
expert as its own deployment (see :mod:`scaleforge.models.moe_parts`)."""

from pathlib import Path
from typing import Any

from scaleforge import storage
from scaleforge.artifacts.store import save_artifact
from scaleforge.models.moe import MoEClassifier, MoESpec
from scaleforge.models.moe_parts import split_moe


def save_moe_parts(
    path: str | Path,
    model: MoEClassifier,
    spec: MoESpec,
    *,
    input_dim: int,
    num_classes: int,
    dataset: dict[str, Any],
) -> dict[str, Any]:
    """Write ``<path>-gate`` and ``<path>-expert-<i>`` next to the whole model's artifact at ``path``.

    Returns:
        The ``parts`` entry for the whole model's manifest: the gate's and experts' folders.
    """
    base = storage.normalize(path)
    gate, gate_spec, experts = split_moe(model, spec, input_dim, num_classes)
    whole = {"part_of": base}
    gate_path = save_artifact(
        storage.with_suffix(base, "-gate"),
        gate,
        gate_spec,
        input_dim=input_dim,
        num_classes=spec.num_experts,
        dataset=dataset,
        extra={"moe_part": {**whole, "role": "gate"}},
    )
    expert_paths = [
        save_artifact(
            storage.with_suffix(base, f"-expert-{index}"),
            expert,
            expert_spec,
            input_dim=input_dim,
            num_classes=num_classes,
            dataset=dataset,
            extra={"moe_part": {**whole, "role": "expert", "expert": index}},
        )
        for index, (expert, expert_spec) in enumerate(experts)
    ]
    return {
        "gate": str(gate_path),
        "experts": [str(p) for p in expert_paths],
        "combine": spec.gate,
        "top_k": spec.top_k,
    }
