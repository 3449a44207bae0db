"""The recipe chain: each step starts from the previous step's model and writes its own artifact.

The runner knows no step: it hands each one a :class:`RecipeRun` (the job, the data, the model so
far, where to save) and collects the :class:`~scaleforge.compress.steps.StepArtifact` records the
step's ``run`` returns.
"""

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from scaleforge import storage
from scaleforge.artifacts import Artifact, save_artifact
from scaleforge.compress.steps import CompressionStep, ModelState, StepArtifact
from scaleforge.config.compress import CompressJobConfig
from scaleforge.data.in_memory import InMemoryData, load_in_memory
from scaleforge.models import MODEL_SPEC

_log = logging.getLogger(__name__)


@dataclass
class RecipeRun:
    """What a step sees inside the recipe: the job, its data, the model so far and where to save."""

    cfg: CompressJobConfig
    data: InMemoryData
    teacher_manifest: dict
    state: ModelState
    artifact: str
    """The artifact holding ``state`` (the teacher, or the previous step's output)."""
    name: str = ""
    """This step's name in the report and its folder (``01-prune``)."""
    target: str = ""
    """The folder (or URI) of this step's artifact."""

    def save(self, state: ModelState, compression: dict) -> Path:
        """``state`` as this step's artifact, with the teacher's dataset and tokenizer entries."""
        return save_model_state(self.target, state, self.teacher_manifest, self.data, compression)


def teacher_state(teacher: Artifact) -> ModelState:
    """The teacher as the recipe's (and every sweep point's) starting model."""
    spec = MODEL_SPEC.validate_python(teacher.manifest["model"])
    return ModelState(teacher.model, spec, list(teacher.manifest.get("architecture", [])))


def run_recipe(
    steps: list[CompressionStep], cfg: CompressJobConfig, teacher: Artifact, data: InMemoryData, folder: str
) -> list[StepArtifact]:
    """Run ``steps`` in order from ``teacher``, each writing under ``folder/<index>-<step>``.

    Returns:
        Every artifact the steps wrote, in order; the last one holds the recipe's final model.
    """
    recipe = RecipeRun(cfg, data, teacher.manifest, teacher_state(teacher), str(teacher.path))
    chain: list[StepArtifact] = []
    for index, step in enumerate(steps):
        name = f"{index:02d}-{step.step}"
        _log.warning(f"[compress] step {index + 1}/{len(steps)}: {step.step}")
        outcome = step.run(replace(recipe, name=name, target=storage.join(folder, name)))
        chain += outcome.artifacts
        recipe = replace(recipe, state=outcome.state, artifact=outcome.artifacts[-1].artifact)
    return chain


def save_model_state(
    target: str, state: ModelState, teacher_manifest: dict, data: InMemoryData, compression: dict
) -> Path:
    """``state`` as an artifact at ``target``, scored on ``data``, its manifest listing the edits."""
    return save_artifact(
        target,
        state.model,
        state.spec,
        input_dim=data.info.input_dim,
        num_classes=data.info.num_classes,
        metrics=data.metrics(state.model),
        dataset=teacher_manifest.get("dataset"),
        architecture=state.edits or None,
        extra={"compression": compression, **tokenizer_entry(teacher_manifest)},
    )


def tokenizer_entry(manifest: dict) -> dict:
    """A language model's tokenizer entry, carried from artifact to artifact as the trainer writes it."""
    return {"tokenizer": manifest["tokenizer"]} if "tokenizer" in manifest else {}


def teacher_data(spec, manifest: dict) -> InMemoryData:
    """``spec``'s data in memory, a language model's text tokenized by the teacher's own tokenizer (a
    BPE trained on other bytes gives other ids, which a student distilled from it must share)."""
    from scaleforge.text.tokenizer import tokenizer_from_json

    recorded = manifest.get("tokenizer")
    return load_in_memory(spec, tokenizer_from_json(recorded) if recorded else None)
