"""What the parts of bench/paramserver.py share: the target, the config and its reading."""

import math
import statistics
from collections.abc import Iterable
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


def median_to_target(values: Iterable[float]) -> float:
    """The median of times (or gradients) to the target, a run that never got there (nan or inf) counting
    as worse than any that did: inf when the median run never got there.

    ``statistics.median`` over raw nan does not: nan compares neither smaller nor larger, so the sort
    leaves it where it was and the middle element can be a run faster than the true median.
    """
    return statistics.median(sorted(math.inf if math.isnan(v) else v for v in values))


def ratio_of(numerator: float, denominator: float) -> float:
    """``numerator / denominator`` of two medians to the target: inf when the numerator never got there
    (a bar of at most some ratio is then missed), 0 when only the denominator never did."""
    if not math.isfinite(numerator):
        return math.inf
    return 0.0 if not math.isfinite(denominator) else numerator / denominator


def seconds_shown(value: float) -> str:
    return f"{value:.1f} s" if math.isfinite(value) else "-"


def count_shown(value: float) -> str:
    """A median count of gradients to the target; "-" where the median run never got there."""
    return f"{value:,.0f}" if math.isfinite(value) else "-"


def ratio_shown(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "-"
