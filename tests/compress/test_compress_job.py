"""The compression job end to end on real Ray: distillation on Ray Train, a sweep as parallel Ray
tasks, the report, and a slim artifact that the serving loader rebuilds and that predicts as reported;
teacher, Ray Train runs, artifacts and report all in a bucket of a real S3 server, none on local disk."""

import json

import pytest
import torch
import yaml
from compress_helpers import TINY_DATA, train_tiny_teacher
from safetensors import safe_open

from jobs.compress import main
from scaleforge.artifacts import load_artifact, load_model, read_manifest
from scaleforge.compress.finetune import accuracy
from scaleforge.data import DataSpec, load_arrays
from scaleforge.storage import join, read_bytes, read_text

STUDENT = {"name": "cnn1d", "channels": [16, 16, 16], "kernel_size": 5, "pool": True, "hidden": 32}


@pytest.mark.slow
def test_compress_job_writes_a_slim_artifact_and_a_report_to_a_bucket(ray_cluster, s3, tmp_path, capsys):
    torch.set_num_threads(1)
    teacher = train_tiny_teacher(s3.uri("compress/teacher"), epochs=6)
    config = {
        "teacher": str(teacher),
        "data": TINY_DATA,
        "recipe": [
            {
                "step": "distill",
                "student": STUDENT,
                "compare_hard_labels": False,
                "optim": {"epochs": 4, "batch_size": 128, "lr": 0.003},
            },
            {"step": "prune", "method": "structured", "sparsity": 0.25, "finetune": {"epochs": 1}},
            {"step": "quantize", "scheme": "int8_static"},
            {"step": "export"},
        ],
        "sweeps": [
            {
                "name": "structured",
                "param": "sparsity",
                "values": [0.25, 0.5],
                "step": {"step": "prune", "method": "structured", "sparsity": 0.5, "finetune": {"epochs": 1}},
            }
        ],
        "measure": {"repeats": 5},
        "scaling": {"num_workers": 1},
        "run": {"storage_path": s3.uri("compress/runs")},
        "output": s3.uri("compress/out"),
    }
    (tmp_path / "compress.yaml").write_text(yaml.safe_dump(config))
    assert main(["--config", str(tmp_path / "compress.yaml")]) == 0
    out = s3.uri("compress/out")
    assert f"artifact: {join(out, 'model')}" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["compress.yaml"]  # nothing else on local disk

    report = json.loads(read_text(join(out, "report.json")))
    assert [row["step"] for row in report["recipe"]] == ["distill", "prune", "quantize", "export"]
    for plot in ("accuracy_vs_sparsity.png", "accuracy_vs_size_latency.png"):
        assert read_bytes(join(out, plot))[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| teacher | teacher |" in read_text(join(out, "report.md"))
    quarter, half = report["sweeps"]["structured"]
    assert half["parameters"] < quarter["parameters"] < report["teacher"]["parameters"]

    # The slim model: through the serving loader, it predicts exactly as the report says.
    final = report["recipe"][-1]
    arrays = load_arrays(DataSpec(**TINY_DATA))
    assert accuracy(load_model(join(out, "model")), arrays.x_test, arrays.y_test) == final["accuracy"]
    assert final["vs_teacher"]["smaller"] >= 10 and final["accuracy"] > 0.5
    manifest = read_manifest(join(out, "model"))
    assert [edit["op"] for edit in manifest["architecture"]] == ["shapes", "quantize"]
    assert manifest["model"] == {**STUDENT, "batch_norm": True, "dropout": 0.0}
    with safe_open(load_artifact(join(out, "model")).weights, "pt") as weights:
        assert any(weights.get_tensor(key).dtype == torch.int8 for key in weights.keys())
    assert read_manifest(join(out, "steps", "00-distill"))["training"]["distill"] == {
        "temperature": 4.0,
        "alpha": 0.7,
    }
