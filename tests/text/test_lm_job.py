"""The language-model workload through ``jobs.train``: bad input refused in one line before Ray starts,
and the memory plan. (A run that learns and exports: ``tests/jobs/test_submit.py``, submitted
tensor-parallel; the layouts' numerics against one process: ``tests/distributed/test_lm_parallel.py``.)"""

import os
import subprocess
import sys

import pytest

from conftest import REPO


CASES = {
    ("configs/train_lm_tiny.yaml", "data.source={empty}"): "holds no text files",
    ("configs/train_lm_tiny.yaml", "data.seq_len=128"): "data.seq_len (128) is above model.context (64)",
    ("configs/train_lm_tiny.yaml", "parallel.tp=2"): "parallel.tp (2) must divide model.num_heads (3)",
    ("configs/train_lm_tiny.yaml", "parallel.pp=2"): "parallel.pp (2) must be at most model.num_layers (1)",
    ("configs/train_lm_tiny.yaml", "parallel.fsdp=3"): "must divide scaling.num_workers (2)",
    ("configs/train_lm_1b.yaml", "scaling.device_memory_gb=12"): "layout fsdp=4 x tp=2 needs 18.1 GB per device",
}
EXTRA = {"parallel.tp=2": ["model.num_heads=3", "model.d_model=66"], "parallel.pp=2": ["model.num_layers=1"]}


def test_bad_lm_input_is_one_line_before_ray_starts(tmp_path):
    ray_tmp, empty = tmp_path / "ray", tmp_path / "empty"
    ray_tmp.mkdir()
    empty.mkdir()
    (empty / "image.bin").write_bytes(b"\xff\xfe\x00\x81" * 64)  # not UTF-8: not text
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "RAY_ADDRESS": ""}
    procs = {}
    for (config, override), expected in CASES.items():
        overrides = [override.format(empty=empty), *EXTRA.get(override, [])]
        command = [sys.executable, "-m", "jobs.train", "--config", config] + [a for o in overrides for a in ("--set", o)]
        procs[override] = (expected, subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                                      stderr=subprocess.PIPE, text=True))
    for override, (expected, proc) in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 2, (override, err)
        assert len(err.strip().splitlines()) == 1 and expected in err, (override, err)
        assert "Traceback" not in err and out == ""
    assert list(ray_tmp.iterdir()) == [], "a Ray session was created for an invalid config"


def test_plan_prints_every_layout_and_refuses_one_that_does_not_fit():
    plan = subprocess.run([sys.executable, "-m", "jobs.train", "--config", "configs/train_lm_1b.yaml", "--plan"],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
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
    assert lines[-1] == "layout fsdp=4 x tp=2 needs 18.1 GB per device, within scaling.device_memory_gb (80)"
    refused = subprocess.run([sys.executable, "-m", "jobs.train", "--config", "configs/train_lm_1b.yaml", "--plan",
                              "--set", "scaling.device_memory_gb=12"], cwd=REPO, capture_output=True, text=True,
                             timeout=180)
    assert refused.returncode == 2
    assert "fsdp=4 x tp=2" in refused.stdout and "NO  <- this job" in refused.stdout
    assert refused.stderr.strip().endswith("more than scaling.device_memory_gb (12); see --plan for layouts that fit")
