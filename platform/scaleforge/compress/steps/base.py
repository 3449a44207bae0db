"""A compression step: its config entry and what it does, one class in one file per step.

Every step is a pydantic model, its entry in ``recipe`` and ``sweeps`` (tagged by ``step``), whose
methods are the step's behaviour:

- ``check(skeleton, label)``: the pre-flight, on a skeleton of the model the step will see;
- ``apply(state, data)``: the model after the step, in memory (what a sweep point runs);
- ``run(recipe)``: the step inside the recipe, writing its artifacts (default: ``apply``, then save);
- ``replay(model, edit, input_dim)``: rebuild the module tree for an architecture edit the step
  wrote to a manifest (``edits`` names them), as the artifact loader does.

Why one class holds both the spec and the behaviour, with torch imported inside the methods:
config validation builds the recipe's tagged union from these classes and must not import torch
(``tests/config/test_config_purity.py``), and adding a step should be adding one file. The
plain-torch algorithms stay in ``scaleforge.compress.<algorithm>`` and ``scaleforge.models.surgery``;
a step's methods import them when they run.
"""

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Optional, get_args

from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveFloat, PositiveInt

from scaleforge.config.loader import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from scaleforge.compress.recipe import RecipeRun
    from scaleforge.config.data import TrainDataSpec
    from scaleforge.data.sources import ArraySplits

Edit = dict[str, Any]
"""An architecture edit as a manifest lists it: ``{"op": ..., ...}``."""


class FinetuneSpec(BaseModel):
    """Fine-tuning after pruning or factorization (plain torch on one worker; Han et al. retrain at lr/10)."""

    model_config = ConfigDict(extra="forbid")

    epochs: NonNegativeInt = 2
    """Passes over the training set after each pruning round or factorization (0: none)."""
    lr: PositiveFloat = 3e-4
    """Constant AdamW learning rate (about a tenth of the teacher's)."""
    batch_size: PositiveInt = 128
    seed: int = 0


@dataclass
class ModelState:
    """A model on its way through the recipe: registry spec + architecture edits = the exact module tree."""

    model: "nn.Module"
    spec: BaseModel
    edits: list[Edit] = field(default_factory=list)

    def copy(self) -> "ModelState":
        """A deep copy of the model (steps change theirs in place) with the same spec and edits."""
        return ModelState(copy.deepcopy(self.model), self.spec, list(self.edits))


@dataclass
class StepArtifact:
    """One model a recipe step or a sweep point wrote: its name in the report, the step, the artifact
    and the step's own measurements."""

    name: str
    step: str
    artifact: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepOutcome:
    """What a recipe step leaves: the model the next step starts from, and the artifacts it wrote
    (the last one holds ``state``)."""

    state: ModelState
    artifacts: list[StepArtifact]


@dataclass
class Skeleton:
    """The model a recipe step will see, as the pre-flight walks the recipe; a step's ``check``
    replaces or narrows it the way the step would."""

    model: "nn.Module"
    spec: dict[str, Any]
    """The registry spec of ``model``, as a manifest holds it."""
    input_dim: int
    num_classes: int
    last: bool = False
    """Whether the step being checked is the recipe's last."""
    frozen: Optional[str] = None
    """Why the model can no longer be changed (a quantized model), or None."""
    int8: bool = False
    """Whether the model holds eager int8 modules (they do not export to ONNX)."""

    def check_layers(self, label: str, names: Optional[list[str]], kinds: tuple) -> None:
        """Raise ConfigError if one of ``names`` is not a layer of ``kinds`` in the model."""
        from scaleforge.models.surgery import prunable_layers

        available = [name for name, layer in prunable_layers(self.model).items() if isinstance(layer, kinds)]
        for name in names or []:
            if name not in available:
                raise ConfigError(f"{label}: unknown layer {name!r}; layers: {', '.join(available)}")


class CompressionStep(BaseModel):
    """The protocol every step implements; subclasses add ``step: Literal["<name>"]`` and their fields."""

    model_config = ConfigDict(extra="forbid")

    sweepable: ClassVar[tuple[str, ...]] = ()
    """The fields a sweep may vary."""
    changes_model: ClassVar[bool] = True
    """False for a step that only writes the model (it may follow quantization)."""
    edits: ClassVar[tuple[str, ...]] = ()
    """The architecture edits (``op``) the step writes to a manifest and ``replay`` rebuilds."""

    def data_problem(self, data: "TrainDataSpec") -> Optional[str]:
        """What in the step does not fit the job's ``data``, for the schema's message (None: it fits)."""
        return None

    def check(self, skeleton: Skeleton, label: str) -> None:
        """Raise ConfigError (message starting with ``label``) if the step cannot run on ``skeleton``;
        change ``skeleton`` as the step will change the model."""

    def apply(self, state: ModelState, data: "ArraySplits") -> tuple[ModelState, dict[str, Any]]:
        """The model after the step (``state.model`` may be changed in place: callers pass a copy) and
        the step's own measurements."""
        raise ValueError(f"step {self.step!r} is not a local step")

    def run(self, recipe: "RecipeRun") -> StepOutcome:
        """The step as the recipe runs it: ``apply`` on a copy, then save the result as the step's
        artifact."""
        state, details = self.apply(recipe.state.copy(), recipe.data)
        path = recipe.save(state, {"step": self.model_dump(mode="json"), **details})
        return StepOutcome(state, [StepArtifact(recipe.name, self.step, path, details)])

    @classmethod
    def note(cls, skeleton: Skeleton, edit: Edit) -> None:
        """What ``edit`` (one of ``edits``, already in the model) means for the steps after it."""

    @classmethod
    def replay(cls, model: "nn.Module", edit: Edit, input_dim: int) -> "nn.Module":
        """``model`` with ``edit`` (one of ``edits``) made to its module tree; the weights load afterwards."""
        raise ValueError(f"step {step_name(cls)!r} writes no architecture edit {edit['op']!r}")


STEPS: dict[str, type[CompressionStep]] = {}
"""Every registered step by name, in registration order (the order the config's errors list them)."""


def step_name(cls: type[CompressionStep]) -> str:
    """The ``step`` tag of a step class (its ``Literal``)."""
    (name,) = get_args(cls.model_fields["step"].annotation)
    return name


def register_step(cls: type[CompressionStep]) -> type[CompressionStep]:
    """Class decorator: add a step to :data:`STEPS`.

    Raises:
        ValueError: the name, or one of its architecture edits, is already another step's.
    """
    name = step_name(cls)
    if name in STEPS:
        raise ValueError(f"compression step {name!r} is already registered ({STEPS[name].__name__})")
    for other in STEPS.values():
        shared = set(cls.edits) & set(other.edits)
        if shared:
            raise ValueError(
                f"step {name!r}: edits {sorted(shared)} are written by step {step_name(other)!r}"
            )
    STEPS[name] = cls
    return cls
