"""Compression of a language model: int8 weights of every Linear layer, a distilled student trained on
the teacher's token distributions through the job, both scored in bits per byte as the report says,
and the steps that do not apply to a language model refused in one line before anything runs."""

import json

import pytest
import torch
import torch.nn.functional as F
import yaml
from compress_helpers import TINY_LM, TINY_TEXT, one_thread, train_tiny_lm_teacher  # noqa: F401 (a fixture)
from safetensors import safe_open
from torch import nn

from jobs.compress import main
from scaleforge.artifacts import load_artifact, load_model, read_manifest, save_artifact
from scaleforge.compress.steps import ModelState, apply_step
from scaleforge.compress.steps.quantize import QuantizeStep
from scaleforge.config.data import TextDataSpec
from scaleforge.data.in_memory import load_in_memory
from scaleforge.distributed.strategy import Batch
from scaleforge.models.surgery import prunable_layers
from scaleforge.train.hooks import TokenDistillation

STUDENT = {
    "name": "transformer_lm",
    "context": 64,
    "d_model": 32,
    "num_heads": 2,
    "num_layers": 1,
    "ff_dim": 64,
    "dropout": 0.0,
}


@pytest.fixture(scope="module")
def text():
    return load_in_memory(TextDataSpec(**TINY_TEXT))


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return train_tiny_lm_teacher(tmp_path_factory.mktemp("lm") / "teacher")


def _linear_bytes(weights_file, linears: list[str], suffix: str) -> tuple[int, set]:
    """Bytes and dtypes of the tensors ``<linear><suffix>`` in a safetensors file."""
    with safe_open(weights_file, "pt") as weights:
        tensors = [weights.get_tensor(name + suffix) for name in linears]
    return sum(t.numel() * t.element_size() for t in tensors), {t.dtype for t in tensors}


def test_int8_dynamic_stores_every_linear_in_int8_and_keeps_bits_per_byte(teacher, text, tmp_path):
    fp32 = load_artifact(teacher)
    linears = list(prunable_layers(fp32.model))
    assert (
        len(linears) == 6 * TINY_LM.num_layers
    )  # query, key, value, out, ff_in, ff_out: the head is the embedding
    state, details = apply_step(
        QuantizeStep(step="quantize", scheme="int8_dynamic"), ModelState(fp32.model, TINY_LM), text
    )
    assert not any(type(m) is nn.Linear for m in state.model.modules())  # no float Linear left

    saved = load_artifact(
        save_artifact(
            tmp_path / "int8", state.model, TINY_LM, input_dim=64, num_classes=256, architecture=state.edits
        )
    )
    before, kinds = _linear_bytes(fp32.weights, linears, ".weight")
    after, int8 = _linear_bytes(saved.weights, linears, "._packed_params._packed_params.0")
    print(
        f"Linear weights {before:,} -> {after:,} bytes; bits/byte {text.score(fp32.model):.4f} -> "
        f"{text.score(saved.model):.4f}"
    )
    assert kinds == {torch.float32} and int8 == {torch.int8}
    assert before / after >= 3.5 and details["weight_bytes_before"] / details["weight_bytes_after"] >= 3.5
    assert text.score(saved.model) == pytest.approx(text.score(fp32.model), abs=0.05)
    assert text.score(saved.model) == text.score(state.model)  # the loader rebuilds the same int8 model


@pytest.mark.parametrize("scheme", ["fp16", "bf16"])
def test_half_precision_takes_token_ids_and_keeps_bits_per_byte(teacher, text, tmp_path, scheme):
    fp32 = load_artifact(teacher)
    state, _ = apply_step(QuantizeStep(step="quantize", scheme=scheme), ModelState(fp32.model, TINY_LM), text)
    loaded = load_model(
        save_artifact(
            tmp_path / scheme, state.model, TINY_LM, input_dim=64, num_classes=256, architecture=state.edits
        )
    )
    assert text.score(loaded) == pytest.approx(text.score(fp32.model), abs=0.05)


def test_token_distillation_runs_the_teacher_on_the_batch_at_every_position(teacher, text):
    model = load_model(teacher)
    x, y = (torch.as_tensor(a[:4], dtype=torch.int64) for a in (text.x, text.y))
    batch, logits = Batch(x, y), torch.randn(4, 64, 256)
    # alpha 0: cross-entropy over every token; a student that equals the teacher has no soft term
    assert TokenDistillation(2.0, 0.0, str(teacher)).task_loss(logits, batch).item() == pytest.approx(
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).item(), rel=1e-6
    )
    with torch.no_grad():
        same = model(x)
    assert TokenDistillation(2.0, 1.0, str(teacher)).task_loss(same, batch).item() == pytest.approx(
        0.0, abs=1e-5
    )
    assert TokenDistillation(2.0, 1.0, str(teacher)).task_loss(logits, batch).item() > 0.1


def _config(tmp_path, teacher, recipe, **fields) -> str:
    config = {
        "teacher": str(teacher),
        "data": TINY_TEXT,
        "recipe": recipe,
        "output": str(tmp_path / "out"),
        "run": {"storage_path": str(tmp_path / "runs")},
        "scaling": {"num_workers": 1},
        "measure": {"repeats": 5, "batch_sizes": [1, 8]},
        **fields,
    }
    (tmp_path / "compress.yaml").write_text(yaml.safe_dump(config))
    return str(tmp_path / "compress.yaml")


NOT_FOR_AN_LM = "does not apply to the language model 'transformer_lm'; its recipe may distill, quantize"


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"recipe": [{"step": "prune", "method": "structured", "sparsity": 0.5}]},
            f"recipe[0] (prune): {NOT_FOR_AN_LM}",
        ),
        ({"recipe": [{"step": "prune", "sparsity": 0.5}]}, f"recipe[0] (prune): {NOT_FOR_AN_LM}"),
        ({"recipe": [{"step": "low_rank", "rank": 8}]}, f"recipe[0] (low_rank): {NOT_FOR_AN_LM}"),
        (
            {"recipe": [{"step": "quantize", "scheme": "int8_static"}]},
            "recipe[0] (quantize): int8_static supports mlp and cnn1d models; "
            "use int8_dynamic for 'transformer_lm'",
        ),
        (
            {"recipe": [{"step": "distill", "student": STUDENT}, {"step": "prune", "sparsity": 0.5}]},
            f"recipe[1] (prune): {NOT_FOR_AN_LM}",
        ),
        (
            {
                "recipe": [{"step": "export"}],
                "sweeps": [
                    {
                        "name": "sparse",
                        "param": "sparsity",
                        "values": [0.5],
                        "step": {"step": "prune", "sparsity": 0.5},
                    }
                ],
            },
            f"sweeps[0] (sparse)[0] (prune): {NOT_FOR_AN_LM}",
        ),
        (
            {"recipe": [{"step": "distill", "student": {"name": "cnn1d"}}]},
            "recipe[0] (distill): student: text (data.kind=text) distills into a transformer_lm, not cnn1d",
        ),
        (
            {"recipe": [{"step": "export"}], "data": {"source": "mnist1d"}},
            "data: the teacher is a language model (transformer_lm) trained on text; set data.kind=text",
        ),
        (
            {"recipe": [{"step": "export"}], "data": {**TINY_TEXT, "seq_len": 128}},
            "data.seq_len (128) is above the teacher's context (64)",
        ),
    ],
)
def test_steps_that_do_not_apply_to_a_language_model_are_refused_in_one_line(
    tmp_path, teacher, capsys, fields, message
):
    code = main(["--config", _config(tmp_path, teacher, **fields)])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_lm_distilled_and_quantized_through_the_job_scores_as_reported(
    ray_cluster, tmp_path, teacher, text, capsys
):
    recipe = [
        {
            "step": "distill",
            "student": STUDENT,
            "temperature": 2.0,
            "alpha": 0.5,
            "compare_hard_labels": False,
            "optim": {"epochs": 1, "batch_size": 32, "lr": 0.006, "seed": 0},
        },
        {"step": "quantize", "scheme": "int8_dynamic"},
        {"step": "export"},
    ]
    assert main(["--config", _config(tmp_path, teacher, recipe)]) == 0
    out = tmp_path / "out"
    summary = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    teacher_row, (student, int8, export) = report["teacher"], report["recipe"]
    print(summary, (out / "report.md").read_text())
    assert (
        report["metric"] == "bits_per_byte"
        and "| model | step | bits/byte | increase |" in (out / "report.md").read_text()
    )
    assert (
        f"validation bits/byte {export['bits_per_byte']:.3f} against {teacher_row['bits_per_byte']:.3f}"
        in summary
    )
    assert (out / "bits_per_byte_vs_size_latency.png").read_bytes()[:4] == b"\x89PNG"

    # The student: a transformer_lm 4x smaller than the teacher, trained on the teacher's distributions,
    # whose artifact records the bits per byte the job's Ray Train run measured and the report's own
    # scoring agrees.
    assert [row["step"] for row in report["recipe"]] == ["distill", "quantize", "export"]
    assert student["vs_teacher"]["fewer_parameters"] >= 4
    manifest = read_manifest(student["artifact"])
    assert manifest["model"]["name"] == "transformer_lm" and manifest["tokenizer"]["type"] == "bytes"
    assert manifest["training"]["distill"] == {"temperature": 2.0, "alpha": 0.5}
    assert manifest["metrics"]["bits_per_byte"] == pytest.approx(student["bits_per_byte"], abs=1e-4)
    assert student["bits_per_byte"] < 8 * 0.75  # it learnt: a byte costs 8 bits unmodelled

    # int8: the student's Linear weights 3.5x smaller, its bits per byte within 0.05; the slim artifact,
    # loaded as serving loads it, scores exactly what the report says.
    assert int8["details"]["weight_bytes_before"] / int8["details"]["weight_bytes_after"] >= 3.5
    assert int8["bits_per_byte"] == pytest.approx(student["bits_per_byte"], abs=0.05)
    slim = load_model(out / "model")
    assert text.score(slim) == export["bits_per_byte"] == int8["bits_per_byte"]
    assert [edit["op"] for edit in read_manifest(out / "model")["architecture"]] == ["quantize"]
