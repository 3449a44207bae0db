"""A tensor-parallel transformer submitted with `ray job submit` reaches 0.92 on MNIST-1D, and its
exported artifact loads and predicts in one process."""

import secrets
import sys

import pytest
import torch

from scaleforge.artifacts import load_artifact
from scaleforge.data import DataSpec, load_arrays
from test_submit import _submit, head  # noqa: F401  (the token-auth head fixture and submit helper)


@pytest.mark.slow
def test_submitted_tensor_parallel_job_reaches_092(head, tmp_path):  # noqa: F811
    address, env = head
    submission_id = f"sf-tp-{secrets.token_hex(3)}"
    out, status, logs = _submit(
        address, env, submission_id,
        sys.executable, "-m", "jobs.train", "--config", "configs/train_tp.yaml",
        "--set", f"run.storage_path={tmp_path / 'runs'}", "--set", f"artifact.dir={tmp_path / 'artifact'}",
    )
    assert f"Job '{submission_id}' succeeded" in status, out.stdout + out.stderr + logs
    assert "[memory] rank 1:" in logs and "(0.5" in logs.split("[memory] rank 1:")[1].splitlines()[0]
    artifact = load_artifact(tmp_path / "artifact")
    assert artifact.manifest["training"]["parallel"]["tp"] == 2
    arrays = load_arrays(DataSpec(source="mnist1d", num_samples=20000, seed=42))  # configs/train_tp.yaml's data
    assert arrays.fingerprint == artifact.manifest["dataset"]["fingerprint"]
    with torch.no_grad():
        predictions = artifact.model(torch.as_tensor(arrays.x_test, dtype=torch.float32)).argmax(1)
    accuracy = (predictions == torch.as_tensor(arrays.y_test)).float().mean().item()
    print(f"tensor-parallel transformer: test accuracy {accuracy:.4f} (job reported "
          f"{artifact.manifest['metrics']['test_accuracy']:.4f})")
    assert accuracy >= 0.92
    assert accuracy == pytest.approx(artifact.manifest["metrics"]["test_accuracy"], abs=2e-3)
