"""The main job as ``make demo`` runs it, and the claim its final table makes: the cascade serves more
inputs per second than the teacher alone, at the teacher's accuracy, under the same load over HTTP.

    .venv/bin/python bench/demo.py      (about 5.5 minutes on 2 idle cores)

Runs ``python -m jobs.pipeline --config configs/pipeline.yaml`` on an embedded Ray, as ``make demo``
does, with its storage in a fresh temporary folder (nothing is reused, and ``~/scaleforge`` is left
alone). The job's progress goes to stderr; its final table, each query pass's cascade/teacher ratio,
then the bars, to stdout. The query stage keeps each served model under the same load (``query`` in
the config: batches of 64 held-out inputs from 8 clients, each sending its next batch when its last one
is answered, for 5 s), through the path the demo uses by default (the table's line below the models
names it), in 3 passes, the models in reverse order every other pass.

Bars: the median of the 3 passes' cascade/teacher inputs/s ratios at least 1.1x (the spread printed
beside it), and the cascade's accuracy at most 0.5 point below the teacher's (issue 18's tolerance);
exit status 1 on a miss.
"""

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "platform"), str(REPO)]

from bars import print_bars  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge.pipeline.records import QueryRecord  # noqa: E402

SPEEDUP = 1.1
"""The least ratio of the cascade's inputs/s to the teacher's."""
ACCURACY_GAP = 0.005
"""How far the cascade's accuracy may fall below the teacher's."""


def run_main_job(storage: Path, config: str = "configs/pipeline.yaml") -> tuple[list[str], float]:
    """``python -m jobs.pipeline --config CONFIG`` with its storage under ``storage``: its console
    (stdout; its lines echoed to stderr as they come) and its wall-clock, from starting the process to
    its exit."""
    command = [sys.executable, "-m", "jobs.pipeline", "--config", config, "--set", f"storage={storage}"]
    lines, began = [], time.perf_counter()
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) as job:
        for line in job.stdout:
            print(line, end="", file=sys.stderr, flush=True)
            lines.append(line.rstrip("\n"))
    if job.returncode != 0:
        raise SystemExit(f"the job failed (exit {job.returncode}): {' '.join(command)}")
    return lines, time.perf_counter() - began


def main() -> int:
    check_and_print()
    with tempfile.TemporaryDirectory(prefix="scaleforge-demo-") as root:
        console, _ = run_main_job(Path(root))
        query = QueryRecord.model_validate_json(
            (Path(root) / "pipeline" / "records" / "query.json").read_text()
        )
    table = console[next(i for i, line in enumerate(console) if line.startswith("served model")) :]
    print(
        "\n".join(line for line in table if not line.startswith("report: "))
    )  # the report was in the temporary folder
    cascade, teacher = query.models["cascade"], query.models["teacher"]
    ratios = cascade.ratios_per_pass(teacher)
    speedup = statistics.median(ratios)
    for index, (ours, theirs) in enumerate(
        zip(cascade.inputs_per_s_per_pass or [], teacher.inputs_per_s_per_pass or []), start=1
    ):
        print(f"pass {index}: cascade {ours:,.0f} / teacher {theirs:,.0f} inputs/s = {ours / theirs:.2f}x")
    print()
    gap = cascade.accuracy - teacher.accuracy
    return print_bars(
        [
            (
                f"cascade / teacher, inputs/s, median of {len(ratios)} passes",
                f"{speedup:.2f}x ({min(ratios):.2f}x-{max(ratios):.2f}x)",
                f">= {SPEEDUP}x",
                speedup >= SPEEDUP,
            ),
            (
                "cascade - teacher, accuracy",
                f"{gap:+.4f} ({cascade.accuracy:.4f} / {teacher.accuracy:.4f})",
                f">= -{ACCURACY_GAP}",
                gap >= -ACCURACY_GAP,
            ),
        ],
        first_column="demo",
    )


if __name__ == "__main__":
    sys.exit(main())
