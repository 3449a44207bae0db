"""c. Stragglers, each kind with the remedy the literature gives it: every mode at its best learning
rate, the median of the seeds."""

import contextlib
import math
import statistics
import sys
from functools import partial

import numpy as np

from paramserver_parts.common import TARGET, ps_config, reached, seconds_shown
from paramserver_parts.scenarios import (
    PERSISTENT_BAR,
    RATES,
    SCENARIOS,
    SEEDS,
    SLOWDOWN,
    SWEEP_SEEDS,
    TRANSIENT_BAR,
)
from paramserver_parts.why import ssp_why
from scaleforge.paramserver import run_async_sgd
from scaleforge.paramserver.consistency import consistency_of


def straggler_run(delays: list[str], mode: list[str], lr: float, seed: int, to_the_end: bool) -> dict:
    """One run: seconds to the target, and the final accuracy after every worker's 5 epochs when
    ``to_the_end`` (else the run stops at the target, within 8 epochs)."""
    cfg = ps_config(
        "workers.num_workers=3",
        "server.num_shards=1",
        *delays,
        *mode,
        f"server.lr={lr}",
        f"workers.seed={seed}",
        *(["run.stop_at_accuracy=null", "workers.epochs=5"] if to_the_end else []),
    )
    with contextlib.redirect_stdout(sys.stderr):
        result = run_async_sgd(cfg)
    seconds, updates = reached(result.curve)
    per_update = consistency_of(cfg.server).gradients_per_update(cfg.workers.num_workers)
    return {
        "seconds": seconds,
        "updates": updates,
        "final": result.test_accuracy,
        "grads_to_target": updates * per_update,
        "gradients": result.updates * per_update,
        "applied": result.updates,
        "staleness": float(np.mean(result.staleness["updates"] or [0])),
    }


def step_seconds() -> float:
    """A worker's step time in this part's setting (3 workers, one shard, async, no delay): wall-clock
    x workers / updates over one epoch."""
    cfg = ps_config(
        "workers.num_workers=3",
        "server.num_shards=1",
        "server.mode=async",
        "workers.epochs=1",
        "run.stop_at_accuracy=null",
    )
    with contextlib.redirect_stdout(sys.stderr):
        result = run_async_sgd(cfg)
    return result.wall_s * 3 / result.updates


def stragglers() -> list:
    """Per scenario and mode: a learning-rate sweep on the sweep seeds, then the other seeds at the
    best rate; under transient stragglers, also where ssp's gradients-to-target go (``_ssp_why``)."""
    rows, step = [], step_seconds()
    delay = round((SLOWDOWN - 1) * step, 4)
    print(
        f"c. A step of a worker takes {step * 1e3:.1f} ms here (3 workers, no delay, measured now); a "
        f"{SLOWDOWN}x slower step sleeps {delay * 1e3:.1f} ms more",
        flush=True,
    )
    for scenario, (meaning, delay_overrides, modes) in SCENARIOS.items():
        delays = [d.format(delay=delay) for d in delay_overrides]
        to_the_end = scenario == "transient"  # final accuracy after equal work is compared there
        print(
            f"c. {scenario} stragglers: {meaning}; seconds to {TARGET:.2f} test accuracy"
            + ("; every run trains its 5 epochs, for the final accuracy" if to_the_end else ""),
            flush=True,
        )
        best = {}
        for name, mode in modes.items():
            sweep = sweep_rates(partial(straggler_run, delays, mode, to_the_end=to_the_end))
            lr = _best_rate(sweep)
            runs = sweep[lr] + [
                straggler_run(delays, mode, lr, seed, to_the_end) for seed in SEEDS[len(SWEEP_SEEDS) :]
            ]
            best[name] = {
                "lr": lr,
                "runs": runs,
                "seconds": statistics.median(r["seconds"] for r in runs),
                "final": statistics.mean(r["final"] for r in runs),
            }
            print(
                f"   {name:28s} sweep, median of seeds {', '.join(map(str, SWEEP_SEEDS))}: "
                + ", ".join(f"lr {r:g} {seconds_shown(_median_seconds(sweep[r]))}" for r in sorted(sweep))
                + f"\n   {'':28s} best lr {lr:g}, seeds {', '.join(map(str, SEEDS))}: "
                + ", ".join(seconds_shown(r["seconds"]) for r in runs)
                + f" (median {seconds_shown(best[name]['seconds'])})"
                + (
                    "; final accuracy "
                    + ", ".join(f"{r['final']:.4f}" for r in runs)
                    + f" after {runs[0]['gradients']:,d} gradients ({runs[0]['applied']:,d} updates)"
                    if to_the_end
                    else ""
                ),
                flush=True,
            )
        for name in modes:  # why a mode wins or not: gradients it needs, and how fast it computes them
            runs = best[name]["runs"]
            print(
                f"   {name:28s} to {TARGET:.2f}: median "
                f"{statistics.median(r['grads_to_target'] for r in runs):,.0f} "
                f"gradients at {statistics.median(r['grads_to_target'] / r['seconds'] for r in runs):.0f} "
                "gradients/s",
                flush=True,
            )
        if to_the_end:
            ssp_why(best)
        sync = best["sync"]["seconds"]
        for name in modes:
            if name == "sync":
                continue
            ratio = best[name]["seconds"] / sync
            bar = PERSISTENT_BAR if scenario == "persistent" else TRANSIENT_BAR
            spread = "-".join(
                seconds_shown(x)
                for x in (
                    min(r["seconds"] for r in best[name]["runs"]),
                    max(r["seconds"] for r in best[name]["runs"]),
                )
            )
            rows.append(
                (
                    f"c. {scenario} straggler: {name} / sync, time to {TARGET:.2f}",
                    f"{best[name]['seconds']:.1f} / {sync:.1f} s = {ratio:.2f} (seeds {spread})",
                    f"<= {bar}",
                    ratio <= bar,
                )
            )
            if to_the_end:
                gap = best["sync"]["final"] - best[name]["final"]
                rows.append(
                    (
                        f"c. {scenario} straggler: {name} final accuracy, mean of {len(SEEDS)} seeds",
                        f"{best[name]['final']:.4f} vs sync {best['sync']['final']:.4f}",
                        ">= sync - 0.005",
                        gap <= 0.005,
                    )
                )
    return rows


def sweep_rates(run) -> dict[float, list[dict]]:
    """``run(lr, seed)`` on every sweep seed at each of ``RATES``, then beyond the grid's edge while
    the best rate is on it (up to 6 rates): {rate: the runs}."""
    sweep = {lr: [run(lr, seed) for seed in SWEEP_SEEDS] for lr in RATES}
    while len(sweep) < 6:
        best = _best_rate(sweep)
        edge = 2 * best if best == max(sweep) else best / 2 if best == min(sweep) else None
        if edge is None or _median_seconds(sweep[best]) == math.inf:
            break
        sweep[edge] = [run(edge, seed) for seed in SWEEP_SEEDS]
    return sweep


def _best_rate(sweep: dict[float, list[dict]]) -> float:
    """The rate of the least median time to the target."""
    return min(sweep, key=lambda r: _median_seconds(sweep[r]))


def _median_seconds(runs: list[dict]) -> float:
    """The median time to the target of ``runs``; a run that never got there counts as never."""
    return statistics.median(r["seconds"] if r["seconds"] == r["seconds"] else math.inf for r in runs)
