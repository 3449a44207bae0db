"""2. Throughput: torchrun DDP against Ray Train, tokens/s of the same model on the same workers over the
same steps."""

import statistics
import time
from pathlib import Path

import ray

from lm_parts.machine import wait_for_no_ray
from lm_parts.runs import in_own_process, job, plain, short_job, timed
from lm_parts.setup import OUT, Sizes, mib
from scaleforge.runtime import ensure_ray

FORMER_DDP_WINDOW = (50, 300)
"""The steps DDP was timed over before both sides were timed over the same ones (Ray Train's were
300-1,000 then as now): its tokens/s over them stays printed."""

SIDES = (  # label, name
    ("torchrun DDP, 2 ranks, no Ray on the machine", "alone"),
    ("torchrun DDP, 2 ranks, beside an idle Ray cluster", "beside"),
    ("Ray Train, 2 workers (on that cluster)", "ours"),
    ("torchrun DDP, 1 rank, no Ray on the machine", "alone 1"),
    ("Ray Train, 1 worker", "ours 1"),
)


def throughput(tmp: Path, sizes: Sizes) -> list:
    """torchrun DDP against Ray Train: tokens/s of the same model on the same two workers, both timed
    over the same steps (``sizes.warmup`` to ``sizes.steps``).

    ``sizes.repeats`` rounds, each of two sides in turn, their order swapped every round so that the
    machine's drift over the part favours neither: torchrun with no Ray on the machine (two ranks, then
    one), and a process of its own (:func:`ray_round`) that starts an embedded Ray, runs DDP beside the
    idle cluster (what the cluster's own processes cost on these cores), then the Ray Train job on two
    workers and on one. The one-rank pair is the same comparison with a core to spare for everything
    but the training: it separates what Ray costs inside a worker from what its processes take from
    two workers that fill both cores. Medians are compared.
    """
    if ray.is_initialized():
        raise RuntimeError(
            "the throughput part measures DDP with no Ray on the machine: run it before the others"
        )
    cfg = job(tmp, "lm_small")
    alone, rounds = [], []
    for index in range(sizes.repeats):
        sides = [
            lambda: alone.append(_alone(tmp, sizes)),
            lambda i=index: rounds.append(in_own_process(tmp, "ray_round", sizes, i)),
        ]
        for side in sides if index % 2 == 0 else sides[::-1]:
            side()
    runs = {
        "alone": [_ddp(a["two"]) for a in alone],
        "beside": [_ddp(r["beside"]) for r in rounds],
        "ours": [_ray(r, "ours") for r in rounds],
        "alone 1": [_ddp(a["one"]) for a in alone],
        "ours 1": [_ray(r, "one") for r in rounds],
    }
    median = {
        name: {key: statistics.median(run[key] for run in each) for key in each[0]}
        for name, each in runs.items()
    }
    _print_sides(cfg, sizes, runs, median)
    steady = {name: m["steady"] for name, m in median.items()}
    print(
        f"  peak RSS per worker: torchrun {mib(alone[-1]['two']['rss_mib_per_rank'])}; "
        f"Ray Train {mib(rounds[-1]['ours'][0]['rss_mib_per_worker'])}\n"
        f"  the idle cluster alone costs DDP {1 - steady['beside'] / steady['alone']:.0%} of its tokens/s; "
        f"Ray Train / DDP beside it {steady['ours'] / steady['beside']:.2f}; end to end, Ray Train / DDP "
        f"{median['ours']['end_to_end'] / median['alone']['end_to_end']:.2f} (2 ranks), "
        f"{median['ours 1']['end_to_end'] / median['alone 1']['end_to_end']:.2f} (1 rank)",
        file=OUT,
    )
    _print_former_window(sizes, alone, steady["ours"])
    ratio, one = steady["ours"] / steady["alone"], steady["ours 1"] / steady["alone 1"]
    return [
        ("steady tokens/s, Ray Train / torchrun DDP", f"{ratio:.2f}", ">= 0.90", ratio >= 0.9),
        ("the same, 1 rank, a core to spare", f"{one:.2f}", ">= 0.90", one >= 0.9),
    ]


def ray_round(tmp: Path, sizes: Sizes) -> dict:
    """One round's Ray side, in a process of its own (:func:`lm_parts.runs.in_own_process`): DDP beside
    the idle embedded cluster, then the Ray Train runs on it, on two workers and on one (metrics, and
    seconds from the call to the steady window), and when the cluster was up."""
    ensure_ray(min_cpus=8)
    ready = time.time()
    time.sleep(15)  # past the cluster's own start-up (its processes and prestarted workers): idle
    beside, launched = plain("ddp", tmp, *_ddp_steps(sizes))
    return {
        "ray_ready_at": ready,
        "beside": {**beside, "launched_at": launched},
        **{
            name: timed(short_job(tmp, "throughput", workers, sizes.steps), sizes.warmup)
            for name, workers in (("ours", 2), ("one", 1))
        },
    }


def _alone(tmp: Path, sizes: Sizes) -> dict:
    """torchrun on two ranks and on one, once no Ray process is left on the machine."""
    wait_for_no_ray(sizes.other_ray_ok)
    runs = {
        "two": plain("ddp", tmp, *_ddp_steps(sizes)),
        "one": plain("ddp", tmp, *_ddp_steps(sizes), ranks=1),
    }
    return {name: {**result, "launched_at": launched} for name, (result, launched) in runs.items()}


def _ddp(run: dict) -> dict:
    """Steady tokens/s, tokens/s end to end (every step's tokens over launch to the last step's end) and
    seconds from launch to the steady window, of one torchrun run."""
    return {
        "steady": run["tokens_per_s"],
        "end_to_end": run["tokens_per_step"] * run["steps"] / (run["finished_at"] - run["launched_at"]),
        "start_up": run["warm_at"] - run["launched_at"],
    }


def _ray(round_: dict, name: str) -> dict:
    """The same for a Ray Train run: its process's start, Ray's included, counts as start-up (launch to
    the cluster up), then the call to its steps; the idle wait and the DDP run between do not."""
    metrics, call_to_warm = round_[name]
    process = round_["ray_ready_at"] - round_["launched_at"]
    return {
        "steady": metrics["steady_tokens_per_s"],
        "end_to_end": metrics["tokens"] / (process + metrics["finished_at"] - metrics["called_at"]),
        "start_up": process + call_to_warm,
    }


def _print_sides(cfg, sizes: Sizes, runs: dict, median: dict) -> None:
    print(
        f"throughput, steps of {cfg.optim.batch_size} x {cfg.data.seq_len} tokens per rank, both sides "
        f"timed over steps {sizes.warmup:,}-{sizes.steps:,} of {sizes.steps:,}; median of {sizes.repeats} "
        "rounds, torchrun and the Ray side in turn. end to end: every step's tokens over the seconds from "
        "launching the process (Ray's start included) to the last step; start-up: launch to the window:",
        file=OUT,
    )
    print(f"  {'':50s} {'steady':>8s} {'end to end':>10s} {'start-up':>8s}  steady, each run", file=OUT)
    for label, name in SIDES:
        m = median[name]
        print(
            f"  {label:50s} {m['steady']:8,.0f} {m['end_to_end']:10,.0f} {m['start_up']:7.1f}s  "
            f"[{', '.join(format(run['steady'], ',.0f') for run in runs[name])}]",
            file=OUT,
        )


def _print_former_window(sizes: Sizes, alone: list, ours: float) -> None:
    first, last = FORMER_DDP_WINDOW
    if sizes.steps < last:
        return
    rates = []
    for run in (a["two"] for a in alone):
        ends = run["step_ends_s"]
        rates.append(run["tokens_per_step"] * (last - first) / (ends[last - 1] - ends[first - 1]))
    former = statistics.median(rates)
    print(
        f"  DDP over its former window, steps {first}-{last} (2 ranks): {former:,.0f} tokens/s; Ray Train "
        f"over steps {sizes.warmup:,}-{sizes.steps:,} / that: {ours / former:.2f}",
        file=OUT,
    )


def _ddp_steps(sizes: Sizes) -> tuple[str, ...]:
    return ("--steps", str(sizes.steps), "--warmup", str(sizes.warmup), *(f"--set={o}" for o in sizes.cut))
