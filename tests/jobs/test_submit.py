"""`ray job submit` against a real head with token authentication, as a user submits work: a
tensor-parallel language-model training job, the stdlib `platform` module inside a job, the token."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO
from scaleforge.artifacts import load_artifact
from scaleforge.cluster import LocalHead
from scaleforge.cluster.local import RAY
from scaleforge.config import TrainJobConfig, load_config
from scaleforge.text.corpus import load_corpus
from scaleforge.text.dataset import windows
from scaleforge.text.tokenizer import ByteTokenizer, unigram_bits_per_byte
from submitting import submit

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
    """Submit ``jobs.train --config config`` (artifact into ``tmp_path/artifact``); its logs once it succeeded."""
    address, env = head
    overrides = [*sets, f"run.storage_path={tmp_path / 'runs'}", f"artifact.dir={tmp_path / 'artifact'}"]
    submission_id, logs = submit(address, env, "sf-train", RUNTIME_ENV, sys.executable, "-m", "jobs.train", "--config",
                                 config, *(arg for item in overrides for arg in ("--set", item)))
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
def test_a_submitted_tensor_parallel_language_model_learns_context_and_scores_text_as_reported(head, tmp_path):
    """``ray job submit`` of ``jobs.train`` with configs/train_lm_tiny.yaml split tensor-parallel (tp=2:
    attention heads and MLP columns on two workers, both taking the same batches of 32) on half its
    bytes for two epochs succeeds; its
    progress (throughput every 50 steps), memory and loss-curve lines reach the job's logs; it learns
    more than byte frequencies; and the exported artifact (weights, tokenizer, config) loads in this
    process and scores the held-out text at exactly the bits per byte the job reported."""
    sets = ["parallel.tp=2", "data.max_train_bytes=150000", "optim.epochs=2", "optim.batch_size=32"]
    cfg = load_config(TrainJobConfig, REPO / "configs/train_lm_tiny.yaml", sets)
    logs = _submit_training(head, tmp_path, "configs/train_lm_tiny.yaml", *sets)
    # Every 50 steps rank 0's throughput: tokens/s and model FLOP/s (6 N + 12 L d T per token).
    assert re.search(r"\[train\] epoch 1 step 50/\d+  [\d,]+ tokens/s  \d+\.\d{3} model TFLOP/s", logs), logs[-5000:]
    assert "[train] epoch 2/2" in logs and f"artifact: {tmp_path / 'artifact'}" in logs
    # Each rank holds its half of the attention and MLP weights, and all of the (small) embeddings.
    share = float(re.search(r"\[memory\] rank 1: .* \((\d\.\d+)x one process\)", logs).group(1))
    assert 0.5 <= share < 0.65, share
    assert "deprecated" not in logs  # Ray Data's ingest defaults used to warn on a mesh job's console
    curve = Path(re.search(r"loss curve: (\S+)", logs).group(1))
    assert curve.stat().st_size > 10_000
    epochs = [float(b) for b in re.findall(r"\[train\] epoch \d/2 .*?bits/byte (\d+\.\d+)", logs)]
    assert len(epochs) == 2 and epochs[1] < epochs[0], epochs
    reported = float(re.search(r"validation bits/byte (\d+\.\d+)", logs).group(1))
    artifact = load_artifact(tmp_path / "artifact")
    assert artifact.manifest["training"]["parallel"]["tp"] == 2
    assert artifact.manifest["tokenizer"] == {"type": "bytes", "vocab_size": 256}
    corpus = load_corpus(cfg.data.source, cfg.data.validation_fraction)
    assert artifact.manifest["dataset"]["fingerprint"] == corpus.fingerprint()
    text = corpus.read("validation")[:cfg.data.max_validation_bytes]  # what the job validated on
    x, y = (torch.from_numpy(a).long() for a in windows(ByteTokenizer().encode(text), cfg.data.seq_len))
    with torch.no_grad():
        nats = sum(F.cross_entropy(artifact.model(bx).flatten(0, 1), by.flatten(), reduction="sum").item()
                   for bx, by in zip(x.split(256), y.split(256)))
    bits = nats / y.numel() / math.log(2)
    unigram = unigram_bits_per_byte(text)
    print(f"the job reported {reported:.3f} bits/byte; its artifact scores {bits:.4f} here; unigram {unigram:.3f}")
    assert bits == pytest.approx(reported, abs=1e-3)  # the job prints three decimals
    assert bits < unigram - 0.5  # it uses context: no byte-frequency model gets there
