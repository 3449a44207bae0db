"""The main job: train the teacher (data parallel) and a parameter-server model, compress the teacher,
train the MoE model, calibrate the cascade, serve cascade and MoE router over HTTP, query them with the
held-out test set, and write a report.

    python -m jobs.pipeline --config configs/pipeline.yaml [--from STAGE] [--set ...]

Each stage reuses its artifacts when a previous run recorded them; ``--from STAGE`` redoes that stage
and every later one. Stages: teacher, async_sgd, compress, moe, calibrate, serve, query.
"""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from scaleforge.config import run_job
from scaleforge.config.pipeline import STAGES, PipelineConfig
from scaleforge.pipeline import Pipeline, StageFailed
from scaleforge.pipeline.preflight import check_runnable
from scaleforge.pipeline.query import serve_and_query
from scaleforge.pipeline.report import final_table, write_report
from scaleforge.runtime import ensure_ray


@dataclass
class PipelineResult:
    records: dict[str, Any]
    report: Path

    def summary(self) -> str:
        return f"{final_table(self.records)}\nreport: {self.report}"


def run_pipeline(cfg: PipelineConfig, redo_from: Optional[str] = None) -> PipelineResult:
    pipeline = Pipeline(cfg, redo_from)
    # Logical CPUs for the Serve stage's many small deployments next to the training stages' workers.
    ensure_ray(min_cpus=8)
    records = pipeline.run(serve_and_query)
    return PipelineResult(records, write_report(records, pipeline.out / "report"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    redo_from = None
    if "--from" in argv:
        at = argv.index("--from")
        redo_from = argv[at + 1] if at + 1 < len(argv) else ""
        del argv[at:at + 2]
        if redo_from not in STAGES:
            print(f"error: --from {redo_from!r}: not a stage; stages are {', '.join(STAGES)}", file=sys.stderr)
            return 2
    try:
        return run_job(PipelineConfig, lambda cfg: run_pipeline(cfg, redo_from), argv, prog="jobs.pipeline",
                       preflight=check_runnable)
    except StageFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
