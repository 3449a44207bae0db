"""`ray job submit` against a real head with token authentication, as a user submits work: a
tensor-parallel language-model training job, the stdlib `platform` module inside a job, the token."""

import json
import math
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO
from submitting import submit

from scaleforge.artifacts import load_artifact
from scaleforge.cluster import LocalHead
from scaleforge.cluster.local import RAY
from scaleforge.config.data import TextDataSpec
from scaleforge.text.corpus import load_corpus
from scaleforge.text.dataset import windows
from scaleforge.text.tokenizer import ByteTokenizer

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


def _submit_training(head, tmp_path, config: str, *sets: str) -> str:
    """Submit ``jobs.train --config config`` (artifact into ``tmp_path/artifact``); its logs once it
    succeeded."""
    address, env = head
    overrides = [*sets, f"run.storage_path={tmp_path / 'runs'}", f"artifact.dir={tmp_path / 'artifact'}"]
    submission_id, logs = submit(
        address,
        env,
        "sf-train",
        RUNTIME_ENV,
        sys.executable,
        "-m",
        "jobs.train",
        "--config",
        config,
        *(arg for item in overrides for arg in ("--set", item)),
    )
    assert f"Job '{submission_id}' succeeded" in logs, logs[-5000:]
    return logs


@pytest.mark.slow
def test_stdlib_platform_inside_a_submitted_job(head):
    address, env = head
    code = "import platform, ray; ray.init(); print('system=' + platform.system(), platform.__file__)"
    submission_id, logs = submit(address, env, "sf-platform", RUNTIME_ENV, sys.executable, "-c", code)
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
def test_a_submitted_tensor_parallel_language_model_scores_held_out_text_as_it_reported(head, tmp_path):
    """``ray job submit`` of ``jobs.train`` with configs/train_lm_small.yaml split tensor-parallel (tp=2,
    attention heads and MLP columns on two workers, on a slice of the corpus) succeeds, its progress and
    memory lines reach the job's logs, and the exported artifact (weights, tokenizer, config) loads in
    this process and scores the held-out text at exactly the bits per byte the job reported."""
    sets = [
        "parallel.tp=2",
        "data.max_train_bytes=50000",
        "data.max_validation_bytes=20000",
        "optim.epochs=1",
        "optim.batch_size=16",
        "optim.lr=0.006",
    ]  # 24 steps: both tp ranks take the same batch
    logs = _submit_training(head, tmp_path, "configs/train_lm_small.yaml", *sets)
    assert "[train] epoch 1/1" in logs and f"artifact: {tmp_path / 'artifact'}" in logs
    assert "[memory] rank 1:" in logs and "(0.5" in logs.split("[memory] rank 1:")[1].splitlines()[0]
    assert "deprecated" not in logs  # Ray Data's ingest defaults used to warn on a mesh job's console
    reported = float(re.search(r"validation bits/byte (\d+\.\d+)", logs).group(1))
    artifact = load_artifact(tmp_path / "artifact")
    assert artifact.manifest["training"]["parallel"]["tp"] == 2
    assert artifact.manifest["tokenizer"] == {"type": "bytes", "vocab_size": 256}
    spec = TextDataSpec(source="stdlib", seq_len=128, max_validation_bytes=20000)  # what the job validated on
    text = load_corpus(spec.source, spec.validation_fraction).read("validation")[: spec.max_validation_bytes]
    x, y = (torch.from_numpy(a).long() for a in windows(ByteTokenizer().encode(text), spec.seq_len))
    with torch.no_grad():
        nats = F.cross_entropy(artifact.model(x).flatten(0, 1), y.flatten(), reduction="sum").item()
    bits = nats / y.numel() / math.log(2)
    print(f"the job reported {reported:.3f} bits/byte; its artifact scores {bits:.4f} here")
    assert bits == pytest.approx(reported, abs=1e-3)  # the job prints three decimals
    assert bits < 8 * 0.75  # it learnt: a byte costs 8 bits unmodelled
