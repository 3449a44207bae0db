"""3. Layouts: tokens/s and memory per worker of each layout the job offers, on the same model."""

from pathlib import Path

from lm_parts.runs import short_job, timed
from lm_parts.setup import LAYOUTS, OUT, Sizes, mib
from scaleforge.runtime import ensure_ray


def layouts(tmp: Path, sizes: Sizes) -> list:
    """Every layout on the same model: tokens/s and memory per worker (a table, no bar)."""
    ensure_ray(min_cpus=8)
    print_layouts(
        {
            name: timed(
                short_job(tmp, name.split()[0], workers, sizes.layout_steps, *overrides), sizes.layout_warmup
            )[0]
            for name, (workers, overrides) in LAYOUTS.items()
        },
        sizes,
    )
    return []


def print_layouts(layouts: dict[str, dict], sizes: Sizes) -> None:
    print(
        f"\nlayouts ({sizes.layout_steps} steps, steady after {sizes.layout_warmup}). params: parameter "
        "MiB each worker "
        "holds; state: parameters + gradients + AdamW moments, as the split strategies measure it, else "
        "4x the "
        "worker's parameters (AdamW); one process holds "
        f"{4 * layouts['dp=2']['param_mib_per_worker'][0]:.2f} MiB of state:",
        file=OUT,
    )
    print(
        f"{'layout':24s} {'tokens/s':>9s} {'params/worker':>23s} {'state/worker':>23s} "
        f"{'peak RSS/worker':>19s}",
        file=OUT,
    )
    for name, metrics in layouts.items():
        params = metrics["param_mib_per_worker"]
        state = (
            [_state(r) for r in metrics["memory_per_worker"]]
            if "memory_per_worker" in metrics
            else [4 * p for p in params]
        )
        print(
            f"{name:24s} {metrics['steady_tokens_per_s']:9,.0f} {mib(params, 2):>23s} {mib(state, 2):>23s} "
            f"{mib(metrics['rss_mib_per_worker']):>19s}",
            file=OUT,
        )


def _state(report: dict) -> float:
    return (report["params"] + report["grads"] + report["optimizer"]) / 2**20
