"""Compression steps in plain torch: each really shrinks or speeds up the model, keeps its accuracy on a
small teacher trained here, and round-trips exactly through the one loader serving uses."""

import copy
import json

import pytest
import torch
from compress_helpers import FULL_TEACHER, TINY_DATA, TINY_TEACHER, one_thread, train_tiny_teacher  # noqa: F401 (a fixture)
from safetensors import safe_open

from scaleforge.artifacts import load_artifact, load_model, save_artifact
from scaleforge.compress.finetune import accuracy
from scaleforge.compress.measure import latency_table
from scaleforge.compress.quantize import float_weight_bytes, quantized_weight_bytes
from scaleforge.compress.steps import FinetuneSpec, ModelState, apply_step
from scaleforge.compress.steps.low_rank import LowRankStep
from scaleforge.compress.steps.prune import PruneStep
from scaleforge.compress.steps.quantize import QuantizeStep
from scaleforge.data import DataSpec, load_arrays
from scaleforge.models import build_model
from scaleforge.models.surgery import layer_shapes
from scaleforge.train.hooks import distillation_loss


@pytest.fixture(scope="module")
def arrays():
    return load_arrays(DataSpec(**TINY_DATA))


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    artifact = load_artifact(train_tiny_teacher(tmp_path_factory.mktemp("teacher")))
    return ModelState(artifact.model, TINY_TEACHER, [])


def _roundtrip(state: ModelState, arrays, folder):
    """Save like the job does and load back through the serving loader."""
    save_artifact(
        folder, state.model, state.spec, input_dim=40, num_classes=10, architecture=state.edits or None
    )
    return load_model(folder)


def _same_predictions(a, b, x):
    with torch.inference_mode():
        return torch.equal(a(torch.as_tensor(x[:512])), b(torch.as_tensor(x[:512])))


def test_unstructured_pruning_is_permanent_and_keeps_accuracy(teacher, arrays, tmp_path):
    base = accuracy(teacher.model, arrays.x_test, arrays.y_test)
    step = PruneStep(step="prune", sparsity=0.9, rounds=3, finetune=FinetuneSpec(epochs=2, lr=1e-3))
    pruned, details = apply_step(step, teacher, arrays)
    assert details["sparsity"] == pytest.approx(0.9, abs=1e-3)
    assert not any(name.endswith(("_orig", "_mask")) for name in pruned.model.state_dict())  # no masks left
    assert base - accuracy(pruned.model, arrays.x_test, arrays.y_test) <= 0.02
    assert _same_predictions(pruned.model, _roundtrip(pruned, arrays, tmp_path / "a"), arrays.x_test)


def _side_by_side_ms(before: torch.nn.Module, after: torch.nn.Module) -> tuple[float, float]:
    """Median ms per batch of 64 of two models, timed round-robin on one thread: load from the other
    xdist worker lands on both alike (timed one after the other, CI once saw int8 at 1.65x, not 2x)."""
    times = latency_table({"before": before, "after": after}, 40, [64], repeats=40, threads=1, rounds=10)
    return times["before"][64], times["after"][64]


def test_structured_pruning_shrinks_layers_and_is_faster(teacher, arrays, tmp_path):
    base = accuracy(teacher.model, arrays.x_test, arrays.y_test)
    step = PruneStep(
        step="prune", method="structured", sparsity=0.5, finetune=FinetuneSpec(epochs=3, lr=1e-3)
    )
    pruned, details = apply_step(step, teacher, arrays)
    shapes = layer_shapes(pruned.model)
    assert shapes["features.3"] == [16, 32] and shapes["head.4"] == [64, 10]  # half width, classes kept
    # 3,200 training examples leave a small teacher little to spare; the full-size bar is in the job's report.
    assert base - accuracy(pruned.model, arrays.x_test, arrays.y_test) <= 0.035
    loaded = _roundtrip(pruned, arrays, tmp_path / "s")
    assert _same_predictions(pruned.model, loaded, arrays.x_test)

    # Speed is a property of the shapes: measure it on the default teacher's architecture.
    full = build_model(FULL_TEACHER, 40, 10).eval()
    half, _ = apply_step(
        step.model_copy(update={"finetune": FinetuneSpec(epochs=0)}), ModelState(full, FULL_TEACHER), arrays
    )
    before, after = _side_by_side_ms(full, half.model)
    assert before / after >= 1.5, (before, after)


def test_low_rank_halves_the_factorized_layer_and_keeps_accuracy(teacher, arrays, tmp_path):
    base = accuracy(teacher.model, arrays.x_test, arrays.y_test)
    step = LowRankStep(step="low_rank", layers=["head.1"], rank=16, finetune=FinetuneSpec(epochs=1, lr=5e-4))
    factorized, details = apply_step(step, teacher, arrays)
    assert details["factorized_params_before"] / details["factorized_params_after"] >= 2
    assert base - accuracy(factorized.model, arrays.x_test, arrays.y_test) <= 0.02
    assert _same_predictions(factorized.model, _roundtrip(factorized, arrays, tmp_path / "l"), arrays.x_test)


def test_full_rank_factorization_is_exact_and_energy_picks_the_rank(teacher, arrays):
    exact, details = apply_step(
        LowRankStep(step="low_rank", layers=["head.1"], rank=128, finetune=FinetuneSpec(epochs=0)),
        teacher,
        arrays,
    )
    x = torch.as_tensor(arrays.x_test[:256])
    with torch.inference_mode():
        torch.testing.assert_close(exact.model(x), teacher.model(x), atol=1e-4, rtol=1e-4)
    _, low = apply_step(
        LowRankStep(step="low_rank", layers=["head.1"], energy=0.5, finetune=FinetuneSpec(epochs=0)),
        teacher,
        arrays,
    )
    _, high = apply_step(
        LowRankStep(step="low_rank", layers=["head.1"], energy=0.99, finetune=FinetuneSpec(epochs=0)),
        teacher,
        arrays,
    )
    assert 1 <= low["ranks"]["head.1"] < high["ranks"]["head.1"] <= 128


def test_int8_static_is_smaller_faster_accurate_and_stored_as_int8_tensors(teacher, arrays, tmp_path):
    base = accuracy(teacher.model, arrays.x_test, arrays.y_test)
    quantized, details = apply_step(QuantizeStep(step="quantize"), teacher, arrays)
    assert base - accuracy(quantized.model, arrays.x_test, arrays.y_test) <= 0.005
    loaded = _roundtrip(quantized, arrays, tmp_path / "q")
    assert _same_predictions(quantized.model, loaded, arrays.x_test)
    with safe_open(tmp_path / "q" / "model.safetensors", "pt") as stored:
        dtypes = {stored.get_tensor(key).dtype for key in stored.keys()}
    assert torch.int8 in dtypes  # int8 weights, scales as tensors; nothing pickled
    manifest = json.loads((tmp_path / "q" / "manifest.json").read_text())
    assert manifest["architecture"] == [{"op": "quantize", "scheme": "int8_static"}]

    # Size and speed on the default teacher's architecture, side by side.
    full = build_model(FULL_TEACHER, 40, 10).eval()
    int8, details = apply_step(
        QuantizeStep(step="quantize"), ModelState(copy.deepcopy(full), FULL_TEACHER), arrays
    )
    assert details["weight_bytes_before"] / details["weight_bytes_after"] >= 3.5
    assert float_weight_bytes(full) == details["weight_bytes_before"]
    assert quantized_weight_bytes(int8.model) == details["weight_bytes_after"]
    before, after = _side_by_side_ms(full, int8.model)
    # int8 kernels, not a float fallback (which runs no faster). The compression issue's 2x is
    # bench/compress.py's row 3, on the trained teacher; this untrained copy at batch 64 measured
    # 1.92-2.12x idle and 1.65-1.93x beside the suite's other worker (two fresh-clone runs failed at 2x).
    assert before / after >= 1.5, (before, after)


@pytest.mark.parametrize("scheme", ["int8_dynamic", "fp16", "bf16"])
def test_other_schemes_round_trip_through_the_loader(teacher, arrays, tmp_path, scheme):
    quantized, _ = apply_step(QuantizeStep(step="quantize", scheme=scheme), teacher, arrays)
    loaded = _roundtrip(quantized, arrays, tmp_path / scheme)
    assert _same_predictions(quantized.model, loaded, arrays.x_test)
    assert (
        accuracy(loaded, arrays.x_test, arrays.y_test)
        >= accuracy(teacher.model, arrays.x_test, arrays.y_test) - 0.01
    )


def test_distillation_loss_is_cross_entropy_at_alpha_zero_and_pulls_towards_the_teacher():
    torch.manual_seed(0)
    student, teacher, labels = (
        torch.randn(8, 10, requires_grad=True),
        torch.randn(8, 10),
        torch.randint(0, 10, (8,)),
    )
    hard = distillation_loss(student, teacher, labels, temperature=4.0, alpha=0.0)
    torch.testing.assert_close(hard, torch.nn.functional.cross_entropy(student, labels))
    assert distillation_loss(teacher, teacher, labels, 4.0, 1.0).item() == pytest.approx(0.0, abs=1e-6)
    assert distillation_loss(student, teacher, labels, 4.0, 1.0).item() > 0


def test_onnx_export_matches_the_torch_model(teacher, arrays, tmp_path):
    import numpy as np
    import onnxruntime

    from scaleforge.compress.onnx import export_onnx

    factorized, _ = apply_step(
        LowRankStep(step="low_rank", rank=16, finetune=FinetuneSpec(epochs=0)), teacher, arrays
    )
    export_onnx(factorized.model, tmp_path / "model.onnx", 40)
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    x = arrays.x_test[:64]
    (logits,) = session.run(None, {"x": x})
    with torch.inference_mode():
        np.testing.assert_allclose(logits, factorized.model(torch.as_tensor(x)).numpy(), atol=1e-4)
