"""The language model against plain PyTorch and general-purpose compressors, side by side in one run.

    .venv/bin/python bench/lm.py           (about 115 minutes on 2 idle cores)
    .venv/bin/python bench/lm.py --quick   (15-25 minutes: everything runs on a slice of the bytes;
                                            its bars say nothing about the full run)

On ``configs/train_lm_small.yaml``'s model and bytes (the standard library's sources):

1. **Quality.** Three runs a side in turn (``--quality-runs``): the config run as shipped (Ray Train,
   2 data-parallel workers, one thread each, in a process of its own whose embedded Ray goes with it);
   then, once no Ray process is left on the machine, one plain PyTorch process, both cores' threads,
   given the same wall-clock as that Ray job took (start-up and the final scoring included on both
   sides), its batch the workers' batches together (the same update per step), its warm-up and cosine
   laid over its training time (``bench/peers/lm_plain.py single``). Both score the same validation
   windows in bits per byte; means and spreads (max - min) are compared: ahead or behind by more than
   the spread is met or missed, a gap inside it a tie. ``gzip -9`` and ``xz -9e`` compress the same
   validation bytes.
2. **Throughput.** The same model, batch and optimiser under PyTorch DDP the torchrun way (two
   processes, gloo, a ``DistributedSampler`` each: ``bench/peers/lm_plain.py ddp``) against the Ray Train
   job with the same two workers and per-rank batches: tokens/s over the same steps on both sides
   (300-1,000: see ``Sizes``), and beside it tokens/s end to end, start-up included. Three rounds, DDP
   (with no Ray on the machine) and the Ray side in turn (the order swapped each round), medians
   compared; DDP also runs beside the idle Ray cluster, which shows what the cluster's own processes
   (GCS, raylet, dashboard, agents, idle workers) cost on these cores, and both sides again on one rank,
   with a core to spare for everything but the training. It runs first, before this process starts a
   Ray of its own.
3. **Layouts.** Tokens/s, model and optimiser state per worker, and peak resident memory per worker
   of each layout the job offers, on the same model (an MoE feed-forward for ``ep``).

Before each plain run it waits for every Ray process on the machine to be gone and refuses to go on
after two minutes (``--other-ray-ok``: only this bench's own, for smoke runs on a shared machine).
Prints each bar with met/missed (or tie); exit status 1 if one was missed.
"""

import argparse
import json
import sys
import tempfile
from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path

import ray

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

import lm_parts  # noqa: E402
import peers  # noqa: E402
from bars import print_bars  # noqa: E402
from lm_parts.layouts import layouts  # noqa: E402
from lm_parts.machine import mark_this_bench  # noqa: E402
from lm_parts.quality import quality, quality_run  # noqa: E402
from lm_parts.setup import QUICK, Sizes  # noqa: E402
from lm_parts.throughput import ray_round, throughput  # noqa: E402
from provenance import check_and_print  # noqa: E402

PARTS = {"throughput": throughput, "quality": quality, "layouts": layouts}
"""In the order they run (``--part`` in any order keeps it)."""

OWN_PROCESS = {"ray_round": ray_round, "quality_run": quality_run}
"""What a part runs in a process of its own (``lm_parts.runs.in_own_process``), by name."""


def main(sizes: Sizes, parts: list[str]) -> int:
    check_and_print()
    mark_this_bench()
    rows = []
    with tempfile.TemporaryDirectory(prefix="scaleforge-bench-lm-") as folder, redirect_stdout(sys.stderr):
        for part in (name for name in PARTS if name in parts):
            rows += PARTS[part](Path(folder), sizes)
    print()
    return print_bars(rows, "target")


def own_process(role: str, out: Path, sizes: Sizes) -> None:
    with tempfile.TemporaryDirectory(prefix="scaleforge-bench-lm-") as folder, redirect_stdout(sys.stderr):
        out.write_text(json.dumps(OWN_PROCESS[role](Path(folder), sizes)))


if __name__ == "__main__":
    # Ray ships the parts (the hook the workers run) to its workers by value, as it ships a script's own.
    for package in (peers, lm_parts):
        ray.cloudpickle.register_pickle_by_value(package)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="every part on a slice of the bytes (bars say nothing)"
    )
    parser.add_argument(
        "--repeats", type=int, help=f"rounds of the throughput part (default {Sizes.repeats})"
    )
    parser.add_argument(
        "--quality-runs", type=int, help=f"runs a side of the quality part (default {Sizes.quality_runs})"
    )
    parser.add_argument(
        "--part", action="append", choices=list(PARTS), help="run only this part (repeatable)"
    )
    parser.add_argument(
        "--other-ray-ok",
        action="store_true",
        help="before a plain run, wait only for this bench's own Ray processes to go, not for every Ray "
        "on the machine (smoke runs on a shared machine; the plain side's figures then mean little)",
    )
    parser.add_argument(
        "--own-process", nargs=2, metavar=("ROLE", "OUT"), help=argparse.SUPPRESS
    )  # a part's run in a process of its own
    parser.add_argument("--sizes", type=json.loads, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.own_process:
        role, out = args.own_process
        own_process(role, Path(out), Sizes(**{**args.sizes, "cut": tuple(args.sizes["cut"])}))
        sys.exit(0)
    sizes = QUICK if args.quick else Sizes()
    sizes = replace(
        sizes,
        repeats=args.repeats or sizes.repeats,
        quality_runs=args.quality_runs or sizes.quality_runs,
        other_ray_ok=args.other_ray_ok,
    )
    sys.exit(main(sizes, args.part or list(PARTS)))
