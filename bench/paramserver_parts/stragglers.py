"""c. Stragglers, each kind with the remedy the literature gives it: every mode at the learning rate of
its least median time on the sweep seeds, scored on seeds that picked nothing."""

import contextlib
import math
import statistics
import sys
from dataclasses import dataclass
from functools import partial

import numpy as np

from paramserver_parts.common import (
    TARGET,
    count_shown,
    median_to_target,
    ps_config,
    ratio_of,
    ratio_shown,
    reached,
    seconds_shown,
)
from paramserver_parts.scenarios import (
    ACCURACY_MARGIN,
    RATES,
    SCENARIOS,
    SCORED_SEEDS,
    SSP_NAME,
    SWEEP_SEEDS,
    Scenario,
)
from paramserver_parts.why import ssp_why
from scaleforge.paramserver import run_async_sgd
from scaleforge.paramserver.consistency import consistency_of

CAP_MARGIN_S = 1.0
"""A sweep run's cap is the least median time so far plus this: more than the 0.5 s between two
measurements, so that a run reaching the target before that median is measured before the cap."""


@dataclass(frozen=True)
class Plan:
    """The rates swept and the seeds of the sweep and of the score (smaller in a smoke run)."""

    rates: tuple[float, ...] = RATES
    sweep_seeds: tuple[int, ...] = SWEEP_SEEDS
    scored_seeds: tuple[int, ...] = SCORED_SEEDS


def straggler_run(
    scenario: Scenario,
    delays: list[str],
    mode,
    lr: float,
    seed: int,
    to_the_end: bool,
    max_seconds: float | None = None,
) -> dict:
    """One run: seconds to the target, and with ``to_the_end`` the final accuracy after every worker's
    ``scenario.epochs`` (else the run stops at the target, within those epochs, or at ``max_seconds``)."""
    cfg = ps_config(
        "workers.num_workers=3",
        "server.num_shards=1",
        *delays,
        *mode,
        f"server.lr={lr}",
        f"workers.seed={seed}",
        f"workers.epochs={scenario.epochs}",
        *(["run.stop_at_accuracy=null"] if to_the_end else []),
        *([f"run.max_seconds={max_seconds:.3f}"] if max_seconds else []),
    )
    with contextlib.redirect_stdout(sys.stderr):
        result = run_async_sgd(cfg)
    seconds, updates = reached(result.curve)
    per_update = consistency_of(cfg.server).gradients_per_update(cfg.workers.num_workers)
    return {
        "seconds": seconds,
        "grads_to_target": updates * per_update if updates else math.inf,
        "final": result.test_accuracy,
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


def stragglers(plan: Plan = Plan()) -> list:
    """Each scenario in turn (a later one may run at the rates an earlier one picked); its rows."""
    rows, step, picked = [], step_seconds(), {}
    print(
        f"c. A step of a worker takes {step * 1e3:.1f} ms here (3 workers, no delay, measured now). Each "
        f"mode's rate is the one of the least median time on seeds {_seeds(plan.sweep_seeds)}; it is scored "
        f"on seeds {_seeds(plan.scored_seeds)}, which picked nothing",
        flush=True,
    )
    for scenario in SCENARIOS:
        best = scenario_runs(scenario, step, plan, picked)
        picked[scenario.name] = {name: b["lr"] for name, b in best.items()}
        rows += scenario_rows(scenario, best)
    return rows


def scenario_runs(scenario: Scenario, step: float, plan: Plan, picked: dict) -> dict[str, dict]:
    """Every mode of ``scenario`` at its rate on the scored seeds (after the sweep that picks the rate,
    unless the scenario takes an earlier one's); prints what ran. {mode: its rate, runs and medians}."""
    delay = round((scenario.slowdown - 1) * step, 4)
    delays = [d.format(delay=delay, p=scenario.probability) for d in scenario.delays]
    print(
        f"c. {scenario.name} stragglers: {scenario.meaning}; a slow step sleeps {delay * 1e3:.1f} ms more; "
        f"seconds to {TARGET:.2f} test accuracy"
        + (
            f"; every scored run trains its {scenario.epochs} epochs (each worker computes the same "
            "gradients in every mode; the backup worker's sync applies 2 of each 3), for the final accuracy"
            if scenario.to_the_end
            else ""
        )
        + (
            f"; each mode at the rate picked under {scenario.rates_of} stragglers, no sweep"
            if scenario.rates_of
            else ""
        ),
        flush=True,
    )
    best = {name: mode_runs(scenario, name, delays, plan, picked) for name in scenario.modes}
    for name in scenario.modes:  # why a mode wins or not: gradients it needs, and how fast it computes them
        runs = best[name]["runs"]
        print(
            f"   {name:28s} to {TARGET:.2f}: median {count_shown(_needed(runs))} gradients at "
            f"{_pace(runs):.0f} gradients/s",
            flush=True,
        )
    if SSP_NAME in scenario.modes:
        ssp_why(best, scenario, plan.scored_seeds, split=scenario.rates_of is None)
    return best


def mode_runs(scenario: Scenario, name: str, delays: list[str], plan: Plan, picked: dict) -> dict:
    """One mode of ``scenario``: its rate (swept here, or the one an earlier scenario picked), then its
    runs on the scored seeds at that rate; prints both. {its rate, runs, median time, mean final}."""
    run = partial(straggler_run, scenario, delays, scenario.modes[name])  # run(lr, seed, to_the_end)
    if scenario.rates_of:
        lr = picked[scenario.rates_of][name]
    else:
        sweep, caps = sweep_rates(partial(run, to_the_end=False), plan)
        lr = _best_rate(sweep)
        print(
            f"   {name:28s} sweep, median of seeds {_seeds(plan.sweep_seeds)}: "
            + ", ".join(f"lr {r:g} {_sweep_shown(sweep[r], caps[r])}" for r in sorted(sweep)),
            flush=True,
        )
    runs = [run(lr, seed, scenario.to_the_end) for seed in plan.scored_seeds]
    result = {
        "lr": lr,
        "runs": runs,
        "seconds": _median_seconds(runs),
        "final": statistics.mean(r["final"] for r in runs),
    }
    print(
        f"   {'' if scenario.rates_of is None else name:28s} lr {lr:g}, scored on seeds "
        f"{_seeds(plan.scored_seeds)}: "
        + ", ".join(seconds_shown(r["seconds"]) for r in runs)
        + f" (median {seconds_shown(result['seconds'])})"
        + (
            "; final accuracy "
            + ", ".join(f"{r['final']:.4f}" for r in runs)
            + f" after {runs[0]['gradients']:,d} gradients applied ({runs[0]['applied']:,d} updates)"
            if scenario.to_the_end
            else ""
        ),
        flush=True,
    )
    return result


def scenario_rows(scenario: Scenario, best: dict[str, dict]) -> list:
    """The bar rows: each compared mode's median time over the other's, and after the same work (when
    the runs train to the end) its final accuracy against the other's."""
    rows = []
    for (name, against), bar in scenario.bars.items():
        ratio = ratio_of(best[name]["seconds"], best[against]["seconds"])
        times = sorted(math.inf if math.isnan(r["seconds"]) else r["seconds"] for r in best[name]["runs"])
        rows.append(
            (
                f"c. {scenario.name} straggler: {name} / {against}, time to {TARGET:.2f}",
                f"{seconds_shown(best[name]['seconds'])} / {seconds_shown(best[against]['seconds'])} = "
                f"{ratio_shown(ratio)} (seeds {seconds_shown(times[0])}-{seconds_shown(times[-1])})",
                f"<= {bar}",
                ratio <= bar,
            )
        )
    if scenario.to_the_end:
        for name, against in scenario.bars:
            final, theirs = best[name]["final"], best[against]["final"]
            rows.append(
                (
                    f"c. {scenario.name} straggler: {name} / {against}, final accuracy, mean of "
                    f"{len(best[name]['runs'])} seeds",
                    f"{final:.4f} vs {theirs:.4f}",
                    f">= theirs - {ACCURACY_MARGIN}",
                    theirs - final <= ACCURACY_MARGIN,
                )
            )
    return rows


def sweep_rates(run, plan: Plan) -> tuple[dict[float, list[dict]], dict[float, float]]:
    """``run(lr, seed, max_seconds=...)`` on every sweep seed at each of the plan's rates, then beyond the
    grid's edge while the best rate is on it (up to 2 rates more; a plan of one rate fixes it).

    The grid runs from its middle outwards, and each rate after the first stops its runs at the least
    median time so far plus ``CAP_MARGIN_S``: a rate can only be picked with a median below that least
    one, so at least half its runs reach the target before the cap, and a run stopped there counts as
    never, slower than the least median alike. The pick is the one the uncapped runs would give (with
    an odd number of sweep seeds, whose median is one run's, below the cap when it matters); the
    slow edges of the grid just stop early. Returns ({rate: the runs}, {rate: the cap of its runs})."""
    sweep, caps = {}, {}

    def add(lr: float) -> None:
        least = min((_median_seconds(runs) for runs in sweep.values()), default=math.inf)
        caps[lr] = least + CAP_MARGIN_S if math.isfinite(least) else math.inf
        sweep[lr] = [
            run(lr, seed, max_seconds=caps[lr] if math.isfinite(caps[lr]) else None)
            for seed in plan.sweep_seeds
        ]

    middle = (len(plan.rates) - 1) / 2
    for lr in sorted(plan.rates, key=lambda r: abs(plan.rates.index(r) - middle)):
        add(lr)
    while 1 < len(plan.rates) and len(sweep) < len(plan.rates) + 2:
        best = _best_rate(sweep)
        edge = 2 * best if best == max(sweep) else best / 2 if best == min(sweep) else None
        if edge is None or _median_seconds(sweep[best]) == math.inf:
            break
        add(edge)
    return sweep, caps


def _sweep_shown(runs: list[dict], cap: float) -> str:
    """A rate's median in the sweep: "> cap" where it never got there within the cap of its runs."""
    median = _median_seconds(runs)
    return seconds_shown(median) if math.isfinite(median) or not math.isfinite(cap) else f"> {cap:.1f} s"


def _best_rate(sweep: dict[float, list[dict]]) -> float:
    """The rate of the least median time to the target."""
    return min(sweep, key=lambda r: _median_seconds(sweep[r]))


def _median_seconds(runs: list[dict]) -> float:
    """The median time to the target of ``runs``; a run that never got there counts as slower than any
    that did."""
    return median_to_target(r["seconds"] for r in runs)


def _needed(runs: list[dict]) -> float:
    """The median gradients to the target, a run that never got there counting as the most."""
    return median_to_target(r["grads_to_target"] for r in runs)


def _pace(runs: list[dict]) -> float:
    """The median gradients per second to the target, over the runs that got there."""
    paces = [r["grads_to_target"] / r["seconds"] for r in runs if math.isfinite(r["grads_to_target"])]
    return statistics.median(paces) if paces else math.nan


def _seeds(seeds: tuple[int, ...]) -> str:
    return ", ".join(map(str, seeds))
