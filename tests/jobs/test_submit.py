"""`ray job submit` against a real head with token authentication, as a user submits work: a
(tensor-parallel) training job, the stdlib `platform` module inside a job, the token."""

import json
import re
import secrets
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from scaleforge.artifacts import load_artifact
from scaleforge.cluster import LocalHead
from scaleforge.cluster.local import RAY
from scaleforge.data import DataSpec, load_arrays

RUNTIME_ENV = json.dumps({"py_modules": ["platform/scaleforge"]})


@pytest.fixture(scope="module")
def head():
    """A Ray head of its own (`ray start --head --block`, free ports, own temp dir), token auth on."""
    with LocalHead(num_cpus=4) as local:
        env = local.env()
        env.pop("RAY_ADDRESS")  # the CLI gets --address; jobs get theirs from the head
        yield local.dashboard_url, env


def _ray(args, env, timeout=600):
    return subprocess.run([RAY, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _submit(address, env, submission_id, *entrypoint) -> str:
    """``ray job submit`` waits for the job and tails its logs to the end, then prints its final
    status ("Job '<id>' succeeded"): everything the tests read, ANSI colours removed."""
    out = _ray(["job", "submit", "--address", address, "--submission-id", submission_id,
                "--working-dir", ".", "--runtime-env-json", RUNTIME_ENV, "--", *entrypoint], env)
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)


def _submit_training(head, tmp_path, config: str, *sets: str) -> str:
    """Submit ``jobs.train --config config`` (artifact into ``tmp_path/artifact``); its logs once it succeeded."""
    address, env = head
    submission_id = f"sf-train-{secrets.token_hex(3)}"
    overrides = [*sets, f"run.storage_path={tmp_path / 'runs'}", f"artifact.dir={tmp_path / 'artifact'}"]
    logs = _submit(address, env, submission_id, sys.executable, "-m", "jobs.train", "--config", config,
                   *(arg for item in overrides for arg in ("--set", item)))
    assert f"Job '{submission_id}' succeeded" in logs, logs[-5000:]
    return logs


@pytest.mark.slow
def test_stdlib_platform_inside_a_submitted_job(head):
    address, env = head
    code = "import platform, ray; ray.init(); print('system=' + platform.system(), platform.__file__)"
    submission_id = f"sf-platform-{secrets.token_hex(3)}"
    logs = _submit(address, env, submission_id, sys.executable, "-c", code)
    assert f"Job '{submission_id}' succeeded" in logs, logs[-5000:]
    assert "system=Linux" in logs and "/working_dir_files/" not in logs.split("system=Linux")[1].split()[0]


@pytest.mark.slow
def test_token_authentication_is_enforced(head):
    address, env = head
    wrong = _ray(["job", "list", "--address", address], {**env, "RAY_AUTH_TOKEN": "0" * 64}, timeout=120)
    assert wrong.returncode != 0
    assert "auth" in (wrong.stdout + wrong.stderr).lower()
    right = _ray(["job", "list", "--address", address], env, timeout=120)
    assert right.returncode == 0, right.stderr


@pytest.mark.slow
def test_a_submitted_tensor_parallel_job_succeeds_and_its_artifact_predicts_what_it_reported(head, tmp_path):
    """``ray job submit`` of ``jobs.train`` with a tensor-parallel transformer (tp=2) succeeds, its
    progress reaches the job's logs, and the exported artifact loads and predicts in one process
    exactly what the job reported. (The full config's 0.92 bar, submitted the same way: ``bench/training.py``.)"""
    logs = _submit_training(head, tmp_path, "configs/train_tp.yaml", "data.num_samples=4000", "optim.epochs=2")
    assert "[train] epoch 2/2" in logs and f"artifact: {tmp_path / 'artifact'}" in logs
    assert "[memory] rank 1:" in logs and "(0.5" in logs.split("[memory] rank 1:")[1].splitlines()[0]
    artifact = load_artifact(tmp_path / "artifact")
    assert artifact.manifest["training"]["parallel"]["tp"] == 2
    assert artifact.manifest["dataset"]["num_train"] == 3200
    arrays = load_arrays(DataSpec(source="mnist1d", num_samples=4000, seed=42))  # configs/train_tp.yaml's data
    assert arrays.fingerprint == artifact.manifest["dataset"]["fingerprint"]
    with torch.no_grad():
        predictions = artifact.model(torch.as_tensor(arrays.x_test, dtype=torch.float32)).argmax(1)
    accuracy = (predictions == torch.as_tensor(arrays.y_test)).float().mean().item()
    assert accuracy == pytest.approx(artifact.manifest["metrics"]["test_accuracy"], abs=2e-3)
    assert accuracy > 0.2  # 10 classes: chance is 0.1 (2 epochs on 3,200 examples)
