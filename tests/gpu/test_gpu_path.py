"""The GPU path, on a machine with CUDA (`make gpu-check`, about 5 minutes); skipped on CPU-only CI.

Data-parallel training with NCCL and bf16 autocast, the tensor-parallel job (two GPUs or more)
and the serving benchmark.
"""

import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS == 0, reason="needs CUDA")]


def _run(*args, timeout=600):
    out = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def _accuracy(artifact):
    return json.loads((artifact / "manifest.json").read_text())["metrics"]["test_accuracy"]


def test_data_parallel_with_nccl_and_bf16(tmp_path):
    workers = min(2, GPUS)  # NCCL needs one GPU per rank
    _run(
        "-m",
        "jobs.train",
        "--config",
        "configs/train_dp.yaml",
        "--set",
        "scaling.use_gpu=true",
        "--set",
        f"scaling.num_workers={workers}",
        "--set",
        "scaling.resources_per_worker={CPU: 1, GPU: 1}",
        "--set",
        "optim.precision=bf16",
        "--set",
        f"artifact.dir={tmp_path / 'dp'}",
        "--set",
        f"run.storage_path={tmp_path / 'runs'}",
    )
    assert _accuracy(tmp_path / "dp") >= 0.95


@pytest.mark.skipif(GPUS < 2, reason="tensor parallelism over NCCL needs two GPUs")
def test_tensor_parallel_job_on_gpus(tmp_path):
    _run(
        "-m",
        "jobs.train",
        "--config",
        "configs/train_tp.yaml",
        "--set",
        "scaling.use_gpu=true",
        "--set",
        "scaling.resources_per_worker={CPU: 1, GPU: 1}",
        "--set",
        f"artifact.dir={tmp_path / 'tp'}",
        "--set",
        f"run.storage_path={tmp_path / 'runs'}",
    )
    assert _accuracy(tmp_path / "tp") >= 0.92


def test_serving_benchmark_runs(tmp_path):
    out = _run("bench/serving.py", "--seconds", "5", "--rounds", "1")
    assert "teacher" in out and "cascade" in out
