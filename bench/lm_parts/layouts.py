"""3. Layouts: tokens/s and memory per worker of each layout the job offers, on the same model, and
``--plan``'s estimate of the fullest worker beside its measured peak."""

from pathlib import Path

from lm_parts.runs import short_job, timed
from lm_parts.setup import LAYOUTS, OUT, Sizes, mib
from scaleforge.runtime import ensure_ray
from scaleforge.train.plan import layout_memory

PLAN_WITHIN = 0.25
"""``--plan``'s estimate of the fullest worker within this share of its measured peak RSS."""


def layouts(tmp: Path, sizes: Sizes) -> list:
    """Every layout on the same model: tokens/s and memory per worker, and a bar: ``--plan`` within
    :data:`PLAN_WITHIN` of the fullest worker's peak on every layout."""
    ensure_ray(min_cpus=8)
    measured = {}
    for name, (workers, overrides) in LAYOUTS.items():
        cfg = short_job(
            tmp, name.split()[0], workers, sizes.layout_steps, *overrides, config=sizes.config_path
        )
        metrics = timed(cfg, sizes.layout_warmup)[0]
        planned = layout_memory(cfg, cfg.dims, cfg.data.seq_len, cfg.data.vocabulary).total / 2**20
        measured[name] = {**metrics, "plan_mib": planned}
    print_layouts(measured, sizes)
    errors = {name: m["plan_mib"] / max(m["rss_mib_per_worker"]) - 1 for name, m in measured.items()}
    worst = max(errors, key=lambda name: abs(errors[name]))
    return [
        (
            "--plan against the fullest worker's peak RSS",
            f"worst {errors[worst]:+.0%} ({worst}); "
            f"{min(errors.values()):+.0%} to {max(errors.values()):+.0%} over {len(errors)} layouts",
            f"within {PLAN_WITHIN:.0%} on every layout",
            all(abs(error) <= PLAN_WITHIN for error in errors.values()),
        )
    ]


def print_layouts(layouts: dict[str, dict], sizes: Sizes) -> None:
    print(
        f"\nlayouts ({sizes.layout_steps} steps, steady after {sizes.layout_warmup}). params: parameter "
        "MiB each worker holds; state: parameters + gradients + AdamW moments, as the split strategies "
        "measure it, else 4x the worker's parameters (AdamW); plan: --plan's total for the fullest worker "
        f"(its runtime 512 MiB included); one process holds "
        f"{4 * layouts['dp=2']['param_mib_per_worker'][0]:.2f} MiB of state:",
        file=OUT,
    )
    print(
        f"{'layout':24s} {'tokens/s':>9s} {'params/worker':>23s} {'state/worker':>23s} "
        f"{'peak RSS/worker':>19s} {'plan':>6s}",
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
            f"{mib(metrics['rss_mib_per_worker']):>19s} {metrics['plan_mib']:6.0f}",
            file=OUT,
        )


def _state(report: dict) -> float:
    return (report["params"] + report["grads"] + report["optimizer"]) / 2**20
