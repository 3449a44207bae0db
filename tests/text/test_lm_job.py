"""The language-model workload through ``jobs.train``: a data-parallel Ray Train run on real text that
learns more than byte frequencies, an artifact that scores held-out text as the job reported, and
bad input refused in one line before Ray starts."""

import math
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, run_plan

from scaleforge.artifacts import load_artifact
from scaleforge.config import TrainJobConfig, load_config
from scaleforge.text.corpus import load_corpus
from scaleforge.text.dataset import windows
from scaleforge.train import run_training
from scaleforge.train.plan import plan_verdict


def _unigram_bits(data: bytes) -> float:
    """Entropy of the byte frequencies of ``data``: what a model that ignores context achieves."""
    counts = np.array(list(Counter(data).values()), dtype=np.float64)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


@pytest.mark.slow
def test_lm_tiny_learns_context_and_its_artifact_scores_text_as_reported(ray_cluster, tmp_path, capsys):
    cfg = load_config(
        TrainJobConfig,
        REPO / "configs" / "train_lm_tiny.yaml",  # half its bytes, two epochs, a worker lost in the second
        [
            f"storage={tmp_path}",
            "data.max_train_bytes=150000",
            "optim.epochs=2",
            "fault.kill_worker_at_epoch=2",
        ],
    )
    result = run_training(cfg)
    summary, console = result.summary(), capsys.readouterr().out
    print(console, summary)
    # Every 50 steps rank 0's throughput: tokens/s and model FLOP/s (6 N + 12 L d T per token).
    assert re.search(r"\[train\] epoch 1 step 50/\d+  [\d,]+ tokens/s  \d+\.\d{3} model TFLOP/s", console), (
        console
    )
    bits = result.metrics["bits_per_byte"]
    assert f"validation bits/byte {bits:.3f}" in summary
    validation = load_corpus().read("validation")[: cfg.data.max_validation_bytes]
    unigram = _unigram_bits(validation)
    print(f"validation bits/byte {bits:.3f}, unigram entropy of the same bytes {unigram:.3f}")
    assert bits < unigram - 0.5  # it uses context: no byte-frequency model gets there
    # Rank 1 died halfway through epoch 2: the restart resumed from epoch 1's checkpoint (Ray Data shards,
    # epoch checkpoints: the default path) and ran epoch 2 once.
    assert [h["epoch"] for h in result.history] == [1, 2]
    # No Ray Train placement-group cleaner ran (scaleforge.train.driver._Trainer): one removed this run's
    # placement group, its controller alive, in two fresh-clone suite runs.
    cleaners = [
        a
        for a in ray_cluster._private.state.actors().values()
        if a["ActorClassName"] == "PlacementGroupCleaner"
    ]
    assert cleaners == []
    assert "resumed from the checkpoint of epoch 1 after a failure" in summary
    assert f"loss curve: {result.loss_curve}" in summary and os.path.getsize(result.loss_curve) > 10_000
    assert result.history[-1]["bits_per_byte"] < result.history[0]["bits_per_byte"]

    artifact = load_artifact(result.artifact)
    assert artifact.manifest["tokenizer"] == {"type": "bytes", "vocab_size": 256}
    assert artifact.manifest["dataset"]["fingerprint"] == load_corpus().fingerprint()
    x, y = (
        torch.from_numpy(a).long()
        for a in windows(np.frombuffer(bytearray(validation), dtype=np.uint8), cfg.data.seq_len)
    )
    with torch.no_grad():
        nats = sum(
            F.cross_entropy(artifact.model(bx).flatten(0, 1), by.flatten(), reduction="sum").item()
            for bx, by in zip(x.split(256), y.split(256))
        )
    assert nats / y.numel() / math.log(2) == pytest.approx(bits, abs=1e-4)


CASES = {
    ("configs/train_lm_tiny.yaml", "data.source={empty}"): "holds no text files",
    ("configs/train_lm_tiny.yaml", "data.seq_len=128"): "data.seq_len (128) is above model.context (64)",
    ("configs/train_lm_tiny.yaml", "parallel.tp=2"): "parallel.tp (2) must divide model.num_heads (3)",
    ("configs/train_lm_tiny.yaml", "parallel.pp=2"): "parallel.pp (2) must be at most model.num_layers (1)",
    ("configs/train_lm_tiny.yaml", "parallel.fsdp=3"): "must divide scaling.num_workers (2)",
    ("configs/train_lm_tiny.yaml", "scaling.num_workers={{min: 2, max: 4}}"): (
        "scaling.num_workers {min: 2, max: 4}: Ray Train may run the group on any size in the range, "
        "and 3 workers cannot take this layout"
    ),
    (
        "configs/train_lm_1b.yaml",
        "scaling.device_memory_gb=12",
    ): "layout fsdp=4 x tp=2 needs 19.0 GB per device",
}
EXTRA = {
    "parallel.tp=2": ["model.num_heads=3", "model.d_model=66"],
    "parallel.pp=2": ["model.num_layers=1"],
    "scaling.num_workers={{min: 2, max: 4}}": ["parallel.fsdp=2"],  # an elastic range fsdp cannot take
}


def test_bad_lm_input_is_one_line_before_ray_starts(tmp_path):
    ray_tmp, empty = tmp_path / "ray", tmp_path / "empty"
    ray_tmp.mkdir()
    empty.mkdir()
    (empty / "image.bin").write_bytes(b"\xff\xfe\x00\x81" * 64)  # not UTF-8: not text
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "RAY_ADDRESS": ""}
    procs = {}
    for (config, override), expected in CASES.items():
        overrides = [override.format(empty=empty), *EXTRA.get(override, [])]
        command = [sys.executable, "-m", "jobs.train", "--config", config] + [
            a for o in overrides for a in ("--set", o)
        ]
        procs[override] = (
            expected,
            subprocess.Popen(
                command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            ),
        )
    for override, (expected, proc) in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 2, (override, err)
        assert len(err.strip().splitlines()) == 1 and expected in err, (override, err)
        assert "Traceback" not in err and out == ""
    assert list(ray_tmp.iterdir()) == [], "a Ray session was created for an invalid config"


def test_plan_prints_every_layout_and_refuses_one_that_does_not_fit():
    plan = run_plan("configs/train_lm_1b.yaml")
    assert plan.returncode == 0, plan.stderr
    print(plan.stdout)
    lines = plan.stdout.splitlines()
    assert "1,009.8M parameters" in lines[0]
    rows = {line[:24].strip(): line[24:].split() for line in lines[2:-1]}  # layout, then its GiB columns
    assert {"fsdp=4 x tp=2", "dp=8", "fsdp=8", "tp=8", "pp=8", "dp=4 x pp=2"} <= set(rows)
    # Model state (params + grads + AdamW) per device: 16 bytes a parameter, divided by the split.
    state = {name: sum(float(v) for v in row[:3]) for name, row in rows.items()}
    assert state["dp=8"] == pytest.approx(16 * 1_009.8e6 / 2**30, rel=0.01)
    assert state["fsdp=8"] == pytest.approx(state["dp=8"] / 8, rel=0.01)
    assert lines[-1] == "layout fsdp=4 x tp=2 needs 19.0 GB per device, within scaling.device_memory_gb (80)"
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobs.train",
            "--config",
            "configs/train_lm_1b.yaml",
            "--plan",
            "--set",
            "scaling.device_memory_gb=12",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert refused.returncode == 2
    assert "fsdp=4 x tp=2" in refused.stdout and "NO  <- this job" in refused.stdout
    assert refused.stderr.strip().endswith(
        "more than scaling.device_memory_gb (12); see --plan for layouts that fit"
    )


def test_the_big_cpu_config_does_not_fit_one_worker_and_fits_two_fully_sharded():
    """``configs/train_lm_big_cpu.yaml`` (``bench/lm_big.py`` trains it): one process's training state
    of its 0.9B parameters exceeds the 10 GiB each worker reserves; fsdp=2 with recomputation fits."""
    cfg = load_config(TrainJobConfig, REPO / "configs/train_lm_big_cpu.yaml")
    cap = cfg.scaling.resources_per_worker["memory"]
    assert cap == 10 * 2**30 and cfg.scaling.device_memory_gb == pytest.approx(cap / 1e9, abs=0.05)
    assert plan_verdict(cfg).startswith("layout fsdp=2 needs 8.5 GB per device, within")  # as --plan ends
    refused = run_plan("configs/train_lm_big_cpu.yaml", "scaling.num_workers=1", "parallel.fsdp=1")
    assert refused.returncode == 2
    assert "layout dp=1 needs 15.1 GB per device" in refused.stderr, refused.stderr
