"""The main job: train the teacher (data parallel) and a parameter-server model, compress the teacher,
train the MoE model, calibrate the cascade, serve cascade and MoE router over HTTP, query them with the
held-out test set, and write a report.

    python -m jobs.pipeline --config configs/pipeline.yaml [--from STAGE] [--set ...]

Each stage reuses its artifacts when a previous run recorded them; ``--from STAGE`` redoes that stage
and every later one. Stages: teacher, async_sgd, compress, moe, calibrate, serve, query.
"""

import argparse
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

from scaleforge.config import run_job
from scaleforge.config.pipeline import STAGES, PipelineConfig, Stage
from scaleforge.pipeline import Pipeline, RecordError, Records, StageFailed
from scaleforge.pipeline.preflight import check_runnable
from scaleforge.pipeline.report import final_table, write_report
from scaleforge.runtime import ensure_ray
from scaleforge.storage import join


@dataclass
class PipelineResult:
    records: Records
    report: str

    def summary(self) -> str:
        return f"{final_table(self.records)}\nreport: {self.report}"


def run_pipeline(cfg: PipelineConfig, redo_from: Optional[Stage] = None) -> PipelineResult:
    pipeline = Pipeline(cfg, redo_from)  # reads the records it reuses: a stale one fails here, before Ray
    # Logical CPUs for the Serve stage's many small deployments next to the training stages' workers.
    ensure_ray(min_cpus=8)
    records = pipeline.run()
    return PipelineResult(records, write_report(records, join(pipeline.out, "report")))


def main(argv: Optional[Sequence[str]] = None) -> int:
    # --from is this job's own option; --config and --set go on to the shared job parser.
    parser = argparse.ArgumentParser(prog="python -m jobs.pipeline", add_help=False, allow_abbrev=False,
                                     exit_on_error=False)
    parser.add_argument("--from", dest="redo_from", choices=STAGES, help="redo this stage and every later one")
    try:
        known, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
        return run_job(PipelineConfig, lambda cfg: run_pipeline(cfg, known.redo_from), rest, prog="jobs.pipeline",
                       preflight=check_runnable)
    except (argparse.ArgumentError, RecordError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except StageFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
