"""c. Why SSP wins or loses under transient stragglers: the gradients it needs over sync's, split into
what its updates need without staleness and what the staleness adds (one worker with no delay; the
library's staleness simulator, one process with no Ray)."""

import contextlib
import math
import statistics
import sys

from paramserver_parts.common import TARGET, count_shown, median_to_target, ps_config, reached
from paramserver_parts.scenarios import SSP_NAME, TRANSIENT_BAR, Scenario
from scaleforge.paramserver import run_async_sgd
from scaleforge.paramserver.staleness import stale_updates


def one_worker_run(lr: float, seed: int) -> int:
    """Gradients (= updates) that one worker, with no delay and so no staleness, takes to the target
    with Adam at ``lr``; 0 if it never gets there."""
    cfg = ps_config(
        "workers.num_workers=1",
        "server.num_shards=1",
        "server.mode=async",
        f"server.lr={lr}",
        f"workers.seed={seed}",
        "workers.epochs=12",
    )
    with contextlib.redirect_stdout(sys.stderr):
        result = run_async_sgd(cfg)
    seconds, updates = reached(result.curve)
    return updates if seconds == seconds else 0


def ssp_why(best: dict, scenario: Scenario, seeds: tuple[int, ...], split: bool, workers: int = 3) -> None:
    """Why SSP wins or loses under transient stragglers: its time over sync's is the gradients it needs
    over sync's (G) times sync's pace over its own (medians of the seeds, so the product is close to the
    measured ratio, not equal to it). Sync's round waits for the slowest of the workers, 1 + (k - 1)(1 -
    (1 - p)^N) steps expected; an SSP worker that never waits takes 1 + p (k - 1) steps a gradient: the
    most SSP's pace can gain on idle cores. The bar then needs G at most the bar times the pace gain.

    G itself splits in two, from one worker with no delay, so no staleness, applying ssp's updates
    (a batch at ssp's rate) on the same seeds: what those updates need without staleness, over sync's
    gradients (sync's are stale-free already: every round reads the last update), times what the
    staleness of the workers' updates in between then adds. ``split``: measure G's parts (a later
    scenario at the same rate would measure the same, as neither part has a straggler)."""
    needed = {name: median_to_target(r["grads_to_target"] for r in best[name]["runs"]) for name in best}
    pace = {
        name: statistics.median(
            [r["grads_to_target"] / r["seconds"] for r in best[name]["runs"] if r["seconds"] == r["seconds"]]
            or [float("nan")]
        )
        for name in best
    }
    ssp, k, p = SSP_NAME, scenario.slowdown, scenario.probability
    gain = (1 + (k - 1) * (1 - (1 - p) ** workers)) / (1 + p * (k - 1))
    g, measured_gain = needed[ssp] / needed["sync"], pace[ssp] / pace["sync"]
    print(
        f"   why: {ssp}/sync = G x sync's pace / ssp's = {g:.2f} x {pace['sync']:.0f} / {pace[ssp]:.0f} "
        "gradients/s = "
        f"{g / measured_gain:.2f}, G the gradients ssp needed over sync's. SSP's pace gain on idle cores, "
        "none of its "
        f"workers ever waiting: {gain:.2f}x (measured {measured_gain:.2f}x); so ssp/sync <= "
        f"{TRANSIENT_BAR} needs "
        f"G <= {TRANSIENT_BAR * gain:.2f} ({TRANSIENT_BAR * measured_gain:.2f} at the measured paces)",
        flush=True,
    )
    if not split:
        print(
            "   G's parts: not measured again (one worker with no delay and the simulator have no straggler; "
            f"ssp runs at the rate of {scenario.rates_of} stragglers, whose lines have them)",
            flush=True,
        )
        return
    alone = [one_worker_run(best[ssp]["lr"], seed) for seed in seeds]
    if not all(alone):
        print(
            f"   G's parts: not measured (one worker did not reach {TARGET:.2f} on every seed: {alone})",
            flush=True,
        )
        return
    one = statistics.median(alone)
    print(
        "   G's parts: one worker with no delay (no staleness) applying ssp's updates (lr "
        f"{best[ssp]['lr']:g}) "
        f"takes {one:,.0f} gradients (median of {', '.join(map(str, alone))}); so G = "
        f"{one / needed['sync']:.2f} "
        f"(ssp's updates without staleness, {one:,.0f} / {needed['sync']:,.0f}) x {needed[ssp] / one:.2f} "
        "(the "
        f"staleness of {workers} workers, {needed[ssp]:,.0f} / {one:,.0f})",
        flush=True,
    )
    cases = {
        "tau 0": (0, False),
        "tau 1": (1, False),
        "tau 1 predicted": (1, True),
        "tau 2": (2, False),
        "tau 2 predicted": (2, True),
    }
    stale = {
        name: [_stale_updates(best[ssp]["lr"], tau, seed, predict) for seed in seeds]
        for name, (tau, predict) in cases.items()
    }
    print(
        f"   staleness alone, one process with no Ray, ssp's updates at lr {best[ssp]['lr']:g}, each "
        "computed on the "
        f"parameters of exactly tau updates before (predicted: on the workers' weight prediction of them): "
        + "; ".join(
            f"{name}: {count_shown(median_to_target(r or math.inf for r in runs))} gradients ("
            + ", ".join(str(r) if r else "-" for r in runs)
            + ")"
            for name, runs in stale.items()
        )
        + f" (- never within 3,000; ssp's mean staleness with "
        f"{workers} workers: {statistics.mean(r['staleness'] for r in best[ssp]['runs']):.2f} updates)",
        flush=True,
    )


def _stale_updates(lr: float, tau: int, seed: int, predict: bool, workers: int = 3) -> int:
    """Gradients to the target in one process, with no Ray and no clock (the library's staleness
    simulator): ssp's updates, each computed on the parameters of exactly ``tau`` updates before, or
    with ``predict`` on the workers' weight prediction of them. 0 if not within 3,000."""
    cfg = ps_config(f"workers.seed={seed}", f"workers.num_workers={workers}")
    return stale_updates(cfg, lr, tau, TARGET, predict=predict, limit=3000)
