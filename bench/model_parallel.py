"""Model-parallel layouts side by side: step time and per-worker memory, at 2 and 4 workers.

    .venv/bin/python bench/model_parallel.py [--workers 2 4] [--steps 6] [--rounds 3]

One transformer (d_model 256, 8 heads, 4 layers, ff 1024: 3.2M parameters), one global batch
of 64 rows, AdamW, gloo on CPU; each layout runs in its own set of processes:

- ``dp``: DDP, every worker holds the whole model;
- ``tp``: heads and feed-forward columns split (DTensor, Megatron layout);
- ``pp gpipe`` / ``pp 1f1b``: stages of consecutive layers, 8 micro-batches;
- ``fsdp``: FSDP2 ``fully_shard`` per layer.

Step time is the median over timed steps of the slowest rank. For pipelines, beside the ideal-schedule
bubble ``(p - 1) / (m + p - 1)`` (GPipe's, Huang et al. 2019, which 1F1B shares):

- ``m t_stage / t_step``: the pipeline's efficiency, the share of the median step that the busiest
  stage spends computing as fast as it computes alone (``t_stage``: that stage's forward+backward of
  one micro-batch, best of 5, timed one rank at a time so that no other stage shares its core). What
  it leaves, ``1 - m t_stage / t_step``, is the bubble with every cost of the schedule in it: waiting
  on neighbours, and compute that runs slower inside the schedule than alone;
- ``idle``: the share of the fastest timed step that the most idle stage spends blocked on a
  neighbour's send or receive (every wait that torch's schedules make, timed inside torch's private
  ``_wait_batch_p2p``): printed beside, held to no bar.

Every layout runs ``--rounds`` times (3), the layouts in turn and their order reversed every other
round; a figure is the median of its rounds, with the range of the efficiency printed. Until the commit
that added rounds the table held one run per layout; that statistic (round 1 alone) is printed beside.

Bars (the point of these layouts is memory; step times on 2 shared cores are reported, not held to a
bar): every tp, pp and fsdp worker holds at most ``1/p + 0.05`` of one process's model state on ``p``
workers; every pipeline's efficiency is at least ``1 - (2 x ideal bubble + 0.1)`` (a bubble of at most
twice the ideal plus 0.1), times ``cores / p`` where the ``p`` stages outnumber the cores: ``p`` stages
that share ``cores`` cores compute at most ``cores / p`` of each step. Exit status 1 if one is missed.
"""

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "platform")]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bars import print_bars  # noqa: E402
from model_parallel_parts.workers import GLOBAL_BATCH, LAYOUTS, MICROBATCHES, SPEC, measure  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge.distributed.memory import single_process_memory  # noqa: E402
from scaleforge.models import build_model, count_parameters  # noqa: E402


def main(argv=None) -> int:
    check_and_print()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each layout, in alternating order")
    args = parser.parse_args(argv)
    model = build_model(SPEC, 40, 10)
    one_process = single_process_memory(model, "adamw").total
    print(
        f"transformer {count_parameters(model):,} parameters, global batch {GLOBAL_BATCH}, "
        f"{MICROBATCHES} micro-batches, {args.steps} timed steps, medians of {args.rounds} rounds; "
        f"one process holds {one_process / 2**20:.1f} MiB of model state; {CORES} cores"
    )
    print(
        "| workers | layout | step ms | vs dp | memory / worker MiB | vs one process "
        "| m t_stage / t_step [range] | idle (fastest step) | bubble ideal |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows, by_round = [], []
    for world in args.workers:
        runs = {name: [] for name in LAYOUTS}
        for round_index in range(args.rounds):
            for name in list(LAYOUTS)[:: 1 if round_index % 2 == 0 else -1]:
                print(
                    f"  round {round_index + 1}: {name} on {world} workers ...", file=sys.stderr, flush=True
                )
                runs[name].append(measure(name, world, args.steps))
        results = {name: _median(figures) for name, figures in runs.items()}
        for name, r in results.items():
            pipeline = name.startswith("pp")
            figures = (
                f"{r['efficiency']:.2f} [{r['efficiency_low']:.2f}-{r['efficiency_high']:.2f}] | "
                f"{r['idle']:.2f} | {_ideal_bubble(world):.2f}"
                if pipeline
                else "- | - | -"
            )
            if pipeline:
                each = ", ".join(f"{f['efficiency']:.2f}" for f in runs[name])
                by_round.append(
                    f"{world} workers, {name}: m t_stage / t_step by round {each}; round 1 alone (one run, "
                    f"the statistic before rounds) {runs[name][0]['efficiency']:.2f}"
                )
            print(
                f"| {world} | {name} | {r['step_s'] * 1e3:.0f} | "
                f"{r['step_s'] / results['dp']['step_s']:.2f}x | "
                f"{r['held'] / 2**20:.1f} | {r['held'] / one_process:.2f}x | {figures} |",
                flush=True,
            )
        rows += _bars(world, results, one_process)
    print("\n".join(["", *by_round, ""]))
    return print_bars(rows, "layout")


def _median(runs: list[dict]) -> dict:
    """A layout's rounds as one row: the median of each figure, and the efficiency's range."""
    row = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    efficiencies = [run["efficiency"] for run in runs]
    return row | {"efficiency_low": min(efficiencies), "efficiency_high": max(efficiencies)}


CORES = len(os.sched_getaffinity(0))


def _ideal_bubble(stages: int) -> float:
    return (stages - 1) / (MICROBATCHES + stages - 1)


def _bars(world: int, results: dict, one_process: int) -> list:
    """Memory of every split layout on ``world`` workers, and each pipeline's efficiency."""
    rows = []
    for name, r in results.items():
        if name != "dp":
            share = r["held"] / one_process
            rows.append(
                (
                    f"{world} workers, {name}: memory of one process",
                    f"{share:.2f}x",
                    f"<= {1 / world + 0.05:.2f}x",
                    share <= 1 / world + 0.05,
                )
            )
        if name.startswith("pp"):
            shared = f" ({CORES} cores)" if world > CORES else ""
            floor = (1 - (2 * _ideal_bubble(world) + 0.1)) * min(1.0, CORES / world)
            rows.append(
                (
                    f"{world} workers, {name}: m t_stage / t_step",
                    f"{r['efficiency']:.2f}",
                    f">= {floor:.2f}{shared}",
                    r["efficiency"] >= floor,
                )
            )
    return rows


if __name__ == "__main__":
    sys.exit(main())
