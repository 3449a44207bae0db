"""2. Throughput: torchrun DDP against Ray Train, steady tokens/s of the same model on the same workers."""

import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import ray

from lm_parts.runs import job, plain, short_job, timed
from lm_parts.setup import OUT, ROOT, Sizes, mib
from scaleforge.runtime import ensure_ray


def throughput(tmp: Path, sizes: Sizes) -> list:
    """torchrun DDP against Ray Train: steady tokens/s of the same model on the same two workers.

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
            lambda: alone.append(
                {
                    "two": plain("ddp", tmp, *_ddp_steps(sizes)),
                    "one": plain("ddp", tmp, *_ddp_steps(sizes), ranks=1),
                }
            ),
            lambda i=index: rounds.append(_in_own_process(tmp, sizes, i)),
        ]
        for side in sides if index % 2 == 0 else sides[::-1]:
            side()
    rates = {
        "alone": [run["two"][0]["tokens_per_s"] for run in alone],
        "beside": [r["beside"]["tokens_per_s"] for r in rounds],
        "ours": [r["ours"][0]["steady_tokens_per_s"] for r in rounds],
        "alone 1": [run["one"][0]["tokens_per_s"] for run in alone],
        "ours 1": [r["one"][0]["steady_tokens_per_s"] for r in rounds],
    }
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(
        f"throughput, steps of {cfg.optim.batch_size} x {cfg.data.seq_len} tokens per rank (DDP: "
        f"{sizes.steps}, steady "
        f"after {sizes.warmup}; Ray Train: {sizes.ray_steps}, steady after {sizes.ray_warmup}); median of "
        f"{sizes.repeats} "
        f"rounds, torchrun and the Ray side in turn (each run's tokens/s in brackets):",
        file=OUT,
    )
    for label, name in (
        ("torchrun DDP, 2 ranks, no Ray on the machine", "alone"),
        ("torchrun DDP, 2 ranks, beside an idle Ray cluster", "beside"),
        ("Ray Train, 2 workers (on that cluster)", "ours"),
        ("torchrun DDP, 1 rank, no Ray on the machine", "alone 1"),
        ("Ray Train, 1 worker", "ours 1"),
    ):
        print(f"  {label:50s} {median[name]:7,.0f} tokens/s [{_each(rates[name])}]", file=OUT)
    print(
        "  until the steady window: torchrun "
        f"{_each((run['two'][0]['warm_at'] - run['two'][1] for run in alone), '.1f')} s "
        f"from launch to step {sizes.warmup}; Ray Train {_each((r['ours'][1] for r in rounds), '.1f')} s "
        "from the call "
        f"to step {sizes.ray_warmup}\n"
        f"  peak RSS per worker: torchrun {mib(alone[-1]['two'][0]['rss_mib_per_rank'])}; "
        f"Ray Train {mib(rounds[-1]['ours'][0]['rss_mib_per_worker'])}",
        file=OUT,
    )
    ratio, one = median["ours"] / median["alone"], median["ours 1"] / median["alone 1"]
    print(
        f"  the idle cluster alone costs DDP {1 - median['beside'] / median['alone']:.0%} of its tokens/s; "
        f"Ray Train / DDP beside it {median['ours'] / median['beside']:.2f}; with a core to spare (1 rank) "
        f"Ray Train / DDP {one:.2f}",
        file=OUT,
    )
    return [
        ("steady tokens/s, Ray Train / torchrun DDP", f"{ratio:.2f}", ">= 0.90", ratio >= 0.9),
        ("the same, 1 rank, a core to spare", f"{one:.2f}", ">= 0.90", one >= 0.9),
    ]


def ray_round(tmp: Path, sizes: Sizes) -> dict:
    """One round's Ray side, in a process of its own (a second ``ray.init`` after ``ray.shutdown`` in one
    process can crash on actor handles that Ray Data keeps): DDP beside the idle embedded cluster, then
    the Ray Train runs on it, on two workers and on one (metrics, and seconds from the call to the
    steady window)."""
    ensure_ray(min_cpus=8)
    time.sleep(15)  # past the cluster's own start-up (its processes and prestarted workers): idle
    beside, _ = plain("ddp", tmp, *_ddp_steps(sizes))
    return {
        "beside": beside,
        **{
            name: timed(short_job(tmp, "throughput", workers, sizes.ray_steps), sizes.ray_warmup)
            for name, workers in (("ours", 2), ("one", 1))
        },
    }


def _in_own_process(tmp: Path, sizes: Sizes, index: int) -> dict:
    out = tmp / f"ray_round_{index}.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "lm.py"),
            "--ray-round",
            str(out),
            "--sizes",
            json.dumps(asdict(sizes)),
        ],
        check=True,
        cwd=ROOT,
        stdout=sys.stderr,
    )
    return json.loads(out.read_text())


def _ddp_steps(sizes: Sizes) -> tuple[str, ...]:
    return ("--steps", str(sizes.steps), "--warmup", str(sizes.warmup), *(f"--set={o}" for o in sizes.cut))


def _each(values, spec: str = ",.0f") -> str:
    return ", ".join(format(v, spec) for v in values)
