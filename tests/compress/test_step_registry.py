"""Adding a compression step is one file: no module outside a step's own file dispatches on a step's
kind (checked on the source), and a step defined and registered here, in a test, is accepted by the
config union, checked by the pre-flight, run by the recipe and replayed by the artifact loader."""

import ast
from typing import Any, Literal

import pytest
import torch
from compress_helpers import TINY_DATA, one_thread, train_tiny_teacher  # noqa: F401 (a fixture)
from conftest import REPO
from pydantic import TypeAdapter
from torch import nn

from scaleforge.artifacts import load_artifact, load_model, read_manifest
from scaleforge.compress.preflight import check_recipe
from scaleforge.compress.recipe import run_recipe
from scaleforge.compress.steps import STEPS, CompressionStep, ModelState, register_step, step_union
from scaleforge.compress.steps.export import ExportStep
from scaleforge.compress.steps.quantize import QuantizeStep
from scaleforge.config.compress import CompressJobConfig
from scaleforge.config.loader import ConfigError
from scaleforge.data.in_memory import load_in_memory

LIBRARY = REPO / "platform" / "scaleforge"
# Every module that once dispatched on a step's kind, and the two that reach steps through the registry.
DISPATCHERS = [
    "config/compress.py",
    "compress/preflight.py",
    "compress/run.py",
    "compress/recipe.py",
    "compress/sweeps.py",
    "compress/steps/registry.py",
    "models/surgery.py",
    "artifacts/store.py",
]


def _step_dispatch(source: str) -> list[str]:
    """Names of step classes, and string literals naming a step or an architecture edit, in ``source``
    (docstrings aside): what an ``isinstance`` chain or an ``if step.step == "prune"`` needs."""
    kinds = {name for name in STEPS} | {op for cls in STEPS.values() for op in cls.edits}
    classes = {cls.__name__ for cls in STEPS.values()}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in classes:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in classes:
            found.append(f"line {node.lineno}: {node.attr}")
        elif isinstance(node, ast.Constant) and node.value in kinds:
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


@pytest.mark.parametrize("module", DISPATCHERS)
def test_no_module_outside_the_step_files_dispatches_on_a_step(module):
    assert _step_dispatch((LIBRARY / module).read_text()) == []


@pytest.mark.parametrize(
    "source",
    [
        'if step.step == "distill":\n    pass',
        "if isinstance(step, PruneStep):\n    pass",
        'SWEEPABLE = {"low_rank": ("rank",)}',
        'if edit["op"] == "factorize":\n    pass',
        "from scaleforge.compress.steps import quantize\nquantize.QuantizeStep",
    ],
)
def test_the_dispatch_reader_sees_every_kind_of_dispatch(source):
    """The check above would pass vacuously if it missed a form of dispatch."""
    assert _step_dispatch(source) != []


def _batchnorm_after_conv(model: nn.Module) -> list[tuple[nn.Sequential, str, str]]:
    """(container, conv child, batchnorm child) for every Conv1d directly followed by a BatchNorm1d."""
    pairs = []
    for module in model.modules():
        if isinstance(module, nn.Sequential):
            children = list(module.named_children())
            for (conv, a), (norm, b) in zip(children, children[1:]):
                if isinstance(a, nn.Conv1d) and isinstance(b, nn.BatchNorm1d):
                    pairs.append((module, conv, norm))
    return pairs


class FoldBatchNormStep(CompressionStep):
    """Fold every BatchNorm1d into the Conv1d before it: the same function with one layer less per block."""

    step: Literal["fold_batchnorm"]

    edits = ("fold_batchnorm",)

    def check(self, skeleton, label: str) -> None:
        if not _batchnorm_after_conv(skeleton.model):
            raise ConfigError(f"{label}: the model has no BatchNorm1d after a Conv1d")

    def apply(self, state: ModelState, data) -> tuple[ModelState, dict[str, Any]]:
        names = {id(module): name for name, module in state.model.named_modules()}
        folded = []
        with torch.no_grad():
            for container, conv_name, norm_name in _batchnorm_after_conv(state.model):
                conv, norm = container.get_submodule(conv_name), container.get_submodule(norm_name)
                scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
                conv.weight.mul_(scale[:, None, None])
                conv.bias.copy_((conv.bias - norm.running_mean) * scale + norm.bias)
                setattr(container, norm_name, nn.Identity())
                folded.append(f"{names[id(container)]}.{norm_name}")
        edit = {"op": "fold_batchnorm", "layers": folded}
        return ModelState(state.model, state.spec, state.edits + [edit]), {"folded": len(folded)}

    @classmethod
    def replay(cls, model: nn.Module, edit: dict, input_dim: int) -> nn.Module:
        for name in edit["layers"]:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, nn.Identity())
        return model


@pytest.fixture
def fold_step():
    register_step(FoldBatchNormStep)
    yield FoldBatchNormStep(step="fold_batchnorm")
    del STEPS["fold_batchnorm"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return load_artifact(train_tiny_teacher(tmp_path_factory.mktemp("teacher"), epochs=4))


def test_a_step_registered_in_one_file_runs_through_union_preflight_recipe_and_loader(
    fold_step, teacher, tmp_path
):
    assert isinstance(
        TypeAdapter(step_union()).validate_python({"step": "fold_batchnorm"}), FoldBatchNormStep
    )
    recipe = [fold_step, QuantizeStep(step="quantize"), ExportStep(step="export")]
    check_recipe(recipe, teacher.model, teacher.manifest, "recipe")
    # The rules every step gets from the walk: nothing that changes the model after quantization.
    with pytest.raises(ConfigError, match=r"recipe\[1\] \(fold_batchnorm\): the model is already quantized"):
        check_recipe([QuantizeStep(step="quantize"), fold_step], teacher.model, teacher.manifest, "recipe")

    cfg = CompressJobConfig(teacher=str(teacher.path), data=TINY_DATA, recipe=[{"step": "export"}])
    data = load_in_memory(cfg.data)
    folded, int8, export = run_recipe(recipe, cfg, teacher, data, str(tmp_path / "steps"))
    assert [artifact.name for artifact in (folded, int8, export)] == [
        "00-fold_batchnorm",
        "01-quantize",
        "02-export",
    ]
    assert folded.details == {"folded": 3}

    # Folding is exact: the loader, replaying the new step's edit, rebuilds a model with no BatchNorm
    # that gives the teacher's logits.
    model = load_model(folded.artifact)
    assert not any(isinstance(module, nn.BatchNorm1d) for module in model.modules())
    x = torch.as_tensor(data.x_test[:256])
    with torch.inference_mode():
        torch.testing.assert_close(model(x), teacher.model(x), atol=1e-4, rtol=1e-4)
    # And composes with the steps after it: the slim artifact replays fold_batchnorm then quantize
    # and scores exactly what its manifest recorded when the recipe saved it.
    manifest = read_manifest(export.artifact)
    assert [edit["op"] for edit in manifest["architecture"]] == ["fold_batchnorm", "quantize"]
    assert data.metrics(load_model(export.artifact)) == manifest["metrics"]
    assert manifest["metrics"]["test_accuracy"] >= data.score(teacher.model) - 0.01


def test_a_second_step_with_a_registered_name_or_edit_is_refused(fold_step):
    with pytest.raises(ValueError, match="'fold_batchnorm' is already registered"):
        register_step(FoldBatchNormStep)

    class Narrow(CompressionStep):
        step: Literal["narrow"]
        edits = ("shapes",)

    with pytest.raises(ValueError, match=r"step 'narrow': edits \['shapes'\] are written by step 'prune'"):
        register_step(Narrow)
    assert "narrow" not in STEPS
