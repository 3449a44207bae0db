"""Training: the shipped training configs against their bars, run in full as a user runs them.

    .venv/bin/python bench/training.py      (about 8 minutes on 2 idle cores)

The test suite checks that training is correct on small data (resume after a worker dies, sharded
checkpoints, hooks, gates, expert parallelism); here the full configs show what they reach:

- ``configs/train_teacher.yaml`` (the teacher the demo compresses and serves);
- ``configs/train_dp.yaml`` with a worker killed halfway through epoch 4 (it must resume and still
  make its bar in time);
- ``configs/train_moe.yaml`` with each gate (top-k, noisy top-k, Gumbel), and without the
  balancing loss (the busiest experts then take more of the load);
- ``configs/train_tp.yaml`` (tensor parallel, 2 workers) submitted with ``ray job submit`` to a
  head of its own with token authentication, its artifact scored in this process;
- ``configs/async_sgd.yaml`` (parameter servers) in each consistency mode, async losing a worker on
  the way and ssp a shard.

Prints each bar with met/missed; exit status 1 if one was missed.
"""

import re
import secrets
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from bars import print_bars  # noqa: E402
from jobs_here import job_folder  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge.artifacts import load_artifact  # noqa: E402
from scaleforge.cluster import LocalHead  # noqa: E402
from scaleforge.cluster.local import RAY  # noqa: E402
from scaleforge.config import AsyncSGDConfig, TrainJobConfig, load_config  # noqa: E402
from scaleforge.data import load_arrays  # noqa: E402
from scaleforge.paramserver import run_async_sgd  # noqa: E402
from scaleforge.paramserver.preflight import check_runnable as ps_check_runnable  # noqa: E402
from scaleforge.runtime import ensure_ray  # noqa: E402
from scaleforge.train import run_training  # noqa: E402
from scaleforge.train.preflight import check_runnable  # noqa: E402


def train(tmp: Path, name: str, config: str, *overrides: str):
    cfg = load_config(
        TrainJobConfig,
        ROOT / "configs" / config,
        [*overrides, f"artifact.dir={tmp / name}", f"run.storage_path={tmp / 'runs'}"],
        check_runnable,
    )
    return run_training(cfg)


PS_FAULTS = {
    "sync": (),
    "async": ("fault.kill_worker_at_step=100",),
    "ssp": ("server.checkpoint_every=50", "fault.kill_shard_at_update=130"),
}


def parameter_server(tmp: Path, mode: str, *overrides: str):
    cfg = load_config(
        AsyncSGDConfig,
        ROOT / "configs/async_sgd.yaml",
        [
            f"server.mode={mode}",
            *overrides,
            f"run.output_dir={tmp / 'ps'}",
            f"artifact.dir={tmp / f'ps-{mode}'}",
        ],
        ps_check_runnable,
    )
    return run_async_sgd(cfg)


def submitted_tp(tmp: Path) -> tuple[float, float]:
    """``ray job submit`` of the tensor-parallel config; (accuracy of the artifact here, reported)."""
    with LocalHead(num_cpus=4) as head:
        env = head.env()
        env.pop("RAY_ADDRESS")
        sid = f"bench-tp-{secrets.token_hex(3)}"
        subprocess.run(
            [
                RAY,
                "job",
                "submit",
                "--address",
                head.dashboard_url,
                "--submission-id",
                sid,
                "--working-dir",
                ".",
                "--runtime-env-json",
                '{"py_modules": ["platform/scaleforge"]}',
                "--",
                sys.executable,
                "-m",
                "jobs.train",
                "--config",
                "configs/train_tp.yaml",
                "--set",
                f"artifact.dir={tmp / 'tp'}",
                "--set",
                f"run.storage_path={tmp / 'tp-runs'}",
            ],
            cwd=ROOT,
            env=env,
            stdout=sys.stderr,
            stderr=sys.stderr,
            timeout=1200,
        )
        status = subprocess.run(
            [RAY, "job", "status", "--address", head.dashboard_url, sid],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    if "succeeded" not in re.sub(r"\x1b\[[0-9;]*m", "", status):
        return float("nan"), float("nan")
    artifact = load_artifact(tmp / "tp")
    arrays = load_arrays(load_config(TrainJobConfig, ROOT / "configs/train_tp.yaml").data)
    with torch.no_grad():
        predicted = artifact.model(torch.as_tensor(arrays.x_test, dtype=torch.float32)).argmax(1).numpy()
    return float((predicted == arrays.y_test).mean()), artifact.manifest["metrics"]["test_accuracy"]


def main() -> int:
    check_and_print()
    rows = []
    with job_folder("training") as tmp:
        tp_accuracy, tp_reported = submitted_tp(tmp)  # before this process starts a Ray of its own
        ensure_ray(min_cpus=4)
        teacher = train(tmp, "teacher", "train_teacher.yaml")
        rows.append(
            (
                "train_teacher.yaml",
                f"accuracy {teacher.metrics['test_accuracy']:.4f}, "
                f"{teacher.num_parameters:,} weights, {teacher.wall_s:.0f} s",
                ">= 0.96, >= 250k, < 300 s",
                teacher.metrics["test_accuracy"] >= 0.96
                and teacher.num_parameters >= 250_000
                and teacher.wall_s < 300,
            )
        )
        dp = train(tmp, "dp", "train_dp.yaml", "fault.kill_worker_at_epoch=4")
        rows.append(
            (
                "train_dp.yaml, a worker killed in epoch 4",
                f"accuracy {dp.metrics['test_accuracy']:.4f}, "
                f"resumed from epoch {dp.metrics['resumed_from_epoch']}, {dp.wall_s:.0f} s",
                ">= 0.95, resumed from 3, < 180 s",
                dp.metrics["test_accuracy"] >= 0.95
                and dp.metrics["resumed_from_epoch"] == 3
                and dp.wall_s < 180,
            )
        )
        moe = {
            gate: train(tmp, f"moe-{gate}", "train_moe.yaml", f"model.gate={gate}")
            for gate in ("topk", "noisy_topk", "gumbel")
        }
        for gate, result in moe.items():
            rows.append(
                (
                    f"train_moe.yaml, gate {gate}",
                    f"accuracy {result.metrics['test_accuracy']:.4f}, "
                    f"expert load cv {result.metrics['expert_load_cv']:.3f}",
                    ">= 0.92",
                    result.metrics["test_accuracy"] >= 0.92,
                )
            )
        plain = train(tmp, "moe-no-aux", "train_moe.yaml", "model.aux_loss_weight=0")
        for mode, fault in PS_FAULTS.items():
            ps = parameter_server(tmp, mode, *fault)
            rows.append(
                (
                    f"async_sgd.yaml, {mode}" + (f", {fault[-1].split('.')[1]}" if fault else ""),
                    f"accuracy {ps.test_accuracy:.4f}, {ps.updates} updates, {len(ps.events)} events",
                    ">= 0.92",
                    ps.test_accuracy >= 0.92 and len(ps.events) == len(fault[-1:]),
                )
            )
        balanced = moe["topk"].metrics["expert_load_cv"]
        rows.append(
            (
                "train_moe.yaml, balancing loss on / off",
                f"expert load cv {balanced:.3f} / {plain.metrics['expert_load_cv']:.3f}",
                "on <= 0.3, off higher",
                balanced <= 0.3 and plain.metrics["expert_load_cv"] > balanced,
            )
        )
    rows.append(
        (
            "train_tp.yaml (tp=2) via ray job submit",
            f"accuracy {tp_accuracy:.4f} (job reported {tp_reported:.4f})",
            ">= 0.92, equal",
            tp_accuracy >= 0.92 and abs(tp_accuracy - tp_reported) < 2e-3,
        )
    )
    return print_bars(rows, "config")


if __name__ == "__main__":
    sys.exit(main())
