"""Every layout of the language model's job, and ``--plan`` beside each one's measured peak memory.

    .venv/bin/python bench/lm_layouts.py           (about 7 minutes on 2 idle cores)

The layouts part of ``bench/lm.py`` (``lm_parts/layouts.py``) on its own, on ``train_lm_small.yaml``'s
model: every layout the job offers (dp, fsdp, tp, pp with GPipe and 1F1B, ep with 4 experts, and the
2-D ones on 4 workers) trains it for 60 steps on Ray Train; tokens/s, state and peak resident memory
per worker, and ``--plan``'s total for the fullest worker. Bar: ``--plan`` within 25% of the fullest
worker's peak on every layout. It ran inside ``bench/lm_speedrun.py`` until that bar's miss on the ep
row was traced to the MoE experts' memory (see below): a table of its own is rerun whenever the
layouts' code changes, without the speedrun's 80 minutes of quality runs.

Prints the bar with met/missed; exit status 1 if it was missed.
"""

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
from lm_parts.setup import Sizes  # noqa: E402
from provenance import check_and_print  # noqa: E402

EARLIER = (
    "earlier, in bench/lm_speedrun.py's table of 2026-12-06, before an MoE expert's rows were padded: "
    "ep=2 peaked at 771/757 MiB against a plan of 571, worst -26% (missed); oneDNN's kernel cache grew "
    "with every new expert matmul shape"
)
"""The bar's figure before the fix that this table's commit carries (kept printed: the rule for a miss)."""


def main() -> int:
    check_and_print()
    mark_this_bench()
    with (
        tempfile.TemporaryDirectory(prefix="scaleforge-bench-layouts-") as folder,
        redirect_stdout(sys.stderr),
    ):
        rows = layouts(Path(folder), replace(Sizes(), config="train_lm_small.yaml"))
    print(EARLIER)
    print()
    return print_bars(rows, "target")


if __name__ == "__main__":
    # Ray ships the parts (the hook the workers run) to its workers by value, as it ships a script's own.
    for package in (peers, lm_parts):
        ray.cloudpickle.register_pickle_by_value(package)
    sys.exit(main())
