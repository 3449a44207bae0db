"""Time to quality: the language model with the levers that pay on these cores, against one plain
PyTorch process given the same levers and the same wall-clock.

    .venv/bin/python bench/lm_speedrun.py           (about 85 minutes on 2 idle cores)
    .venv/bin/python bench/lm_speedrun.py --quick   (a slice of the bytes: its bars say nothing)

With the quality part of ``bench/lm.py`` (``lm_parts/quality.py``), on ``configs/train_lm_speedrun.yaml``
   (``train_lm_small.yaml``'s successor: BPE tokens, the shape and epochs chosen by measured runs, see
   its header). Three runs a side in turn: the config on Ray Train (2 data-parallel workers, a process
   of its own whose embedded Ray goes with it), then, with no Ray process left on the machine, one plain
   PyTorch process (both cores' threads, the same BPE from the same cache, the workers' batches
   together, warm-up and cosine laid over its time) given the wall-clock the Ray run took, start-up and
   scoring included on both sides. Bars: every Ray run at most 1.50 bits/byte on the validation bytes
   within 15 minutes; no worse than the plain process beyond the spread (a tie is a tie). The moonshot,
   printed beside: below ``xz -9e`` on the same bytes. ``--plan`` beside every layout's peak memory is
   ``bench/lm_layouts.py``.

Prints each bar with met/missed (or tie); exit status 1 if one was missed.
"""

import argparse
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
from lm_parts.machine import mark_this_bench  # noqa: E402
from lm_parts.quality import quality  # noqa: E402
from lm_parts.setup import QUICK, Sizes  # noqa: E402
from provenance import check_and_print  # noqa: E402

CONFIG = "train_lm_speedrun.yaml"
TARGET = 1.50
"""Bits per byte every Ray run reaches within 15 minutes (issue 48)."""


def main(sizes: Sizes) -> int:
    check_and_print()
    mark_this_bench()
    with (
        tempfile.TemporaryDirectory(prefix="scaleforge-bench-speedrun-") as folder,
        redirect_stdout(sys.stderr),
    ):
        rows = quality(Path(folder), sizes, TARGET)
    print()
    return print_bars(rows, "target")


if __name__ == "__main__":
    # Ray ships the parts (the hook the workers run) to its workers by value, as it ships a script's own.
    for package in (peers, lm_parts):
        ray.cloudpickle.register_pickle_by_value(package)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a slice of the bytes (bars say nothing)")
    parser.add_argument(
        "--quality-runs", type=int, help=f"runs a side of the quality part (default {Sizes.quality_runs})"
    )
    parser.add_argument(
        "--other-ray-ok",
        action="store_true",
        help="before a plain run, wait only for this bench's own Ray processes to go (smoke runs)",
    )
    args = parser.parse_args()
    sizes = replace(
        QUICK if args.quick else Sizes(),
        config=CONFIG,
        quality_runs=args.quality_runs or Sizes.quality_runs,
        other_ray_ok=args.other_ray_ok,
    )
    sys.exit(main(sizes))
