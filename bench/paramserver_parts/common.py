"""What the parts of bench/paramserver.py share: the target, the config and its reading."""

import math
from pathlib import Path

from scaleforge.config import AsyncSGDConfig, load_config
from scaleforge.paramserver.preflight import check_runnable

ROOT = Path(__file__).resolve().parents[2]
WARMUP_SECONDS = 1.5
TARGET = 0.90
EVAL_EVERY_S = 0.5


def ps_config(*overrides: str) -> AsyncSGDConfig:
    common = [
        "workers.epochs=8",
        f"run.stop_at_accuracy={TARGET}",
        f"run.eval_every_s={EVAL_EVERY_S}",
        "run.output_dir=/tmp/scaleforge-bench-ps",
        "artifact.dir=/tmp/scaleforge-bench-ps/model",
    ]
    return load_config(
        AsyncSGDConfig, ROOT / "configs/async_sgd.yaml", [*common, *overrides], preflight=check_runnable
    )


def reached(curve: list[dict]) -> tuple[float, int]:
    """(seconds, updates) at the first measurement >= the target; nan if none."""
    hits = [p for p in curve if p["test_accuracy"] >= TARGET]
    return (hits[0]["seconds"], hits[0]["updates"]) if hits else (float("nan"), 0)


def seconds_shown(value: float) -> str:
    return f"{value:.1f} s" if math.isfinite(value) else "-"
