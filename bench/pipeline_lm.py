"""The main job on text as a user runs it, ``python -m jobs.pipeline --config configs/pipeline_lm.yaml``,
and the time it promises: end to end on this machine in at most 25 minutes, with its report.

    .venv/bin/python bench/pipeline_lm.py      (about 14 minutes on 2 idle cores)

Runs the job on an embedded Ray with its storage in a fresh temporary folder (nothing is reused, and
``~/scaleforge`` is left alone): the language model trained data-parallel on 2 Ray Train workers
(configs/train_lm_small.yaml), compressed (configs/compress_lm.yaml), its draft length calibrated,
every generator of configs/serve_lm.yaml served over this run's artifacts, queried with 16 held-out
prompts streamed from 1 and then 16 clients, and reported. The job's progress goes to stderr; its final
table, each stage's wall-clock, the sample completions, then the bars, to stdout.

Bars: the job's wall-clock, from starting the process to its exit, at most 25 minutes; every served
generator completed every prompt in full at each load; the report written with its plots. Exit status 1
on a miss.
"""

import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "platform"), str(REPO)]

from bars import print_bars  # noqa: E402
from demo import run_main_job  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge.pipeline.records_lm import LMRecords  # noqa: E402

WALL_S = 25 * 60
"""The most the job may take, start-up included."""
STAGES = ("teacher", "compress", "calibrate", "serve", "query", "report")


def main() -> int:
    check_and_print()
    with tempfile.TemporaryDirectory(prefix="scaleforge-pipeline-lm-") as root:
        console, wall_s = run_main_job(Path(root), "configs/pipeline_lm.yaml")
        out = Path(root) / "pipeline_lm"
        records = LMRecords.model_validate(
            {stage: json.loads((out / "records" / f"{stage}.json").read_text()) for stage in STAGES}
        )
        plots = sorted(p.name for p in (out / "report").glob("*.png"))
        report_written = (out / "report" / "report.md").is_file() and len(plots) == 3
    table = console[next(i for i, line in enumerate(console) if line.startswith("generator        model")) :]
    print("\n".join(line for line in table if not line.startswith("report: ")))  # in the temporary folder
    print("stages: " + ", ".join(f"{s} {getattr(records, s).wall_s:.0f} s" for s in STAGES))
    for sample in records.query.samples:
        print(f"sample: {sample.prompt!r} -> {sample.completion!r}")
    print()
    query = records.query
    loads = [load for generator in query.generators.values() for load in generator.loads]
    complete = all(load.tokens == load.requests * query.max_tokens for load in loads)
    return print_bars(
        [
            (
                "jobs.pipeline --config configs/pipeline_lm.yaml, wall-clock",
                f"{wall_s / 60:.1f} min",
                f"<= {WALL_S // 60} min",
                wall_s <= WALL_S,
            ),
            (
                f"every generator ({len(query.generators)}) completed every prompt at each load",
                "yes" if complete else "no",
                "all",
                complete,
            ),
            ("report.md and its plots", ", ".join(plots), "written", report_written),
        ],
        first_column="pipeline_lm",
    )


if __name__ == "__main__":
    sys.exit(main())
