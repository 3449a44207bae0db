"""The main job: train the teacher (data parallel) and a parameter-server model, compress the teacher,
train the MoE model, calibrate the cascade, serve cascade and MoE router over HTTP, query them with the
held-out test set, and write a report from the records. With ``kind: lm`` (``configs/pipeline_lm.yaml``)
the same chain on text: train the language model, compress it, calibrate the draft length, serve it over
OpenAI's completions API, query it streaming, report.

    python -m jobs.pipeline --config configs/pipeline.yaml [--from STAGE] [--to STAGE] [--set ...]

Each stage reuses its artifacts when a previous run recorded them; ``--from STAGE`` redoes that stage
and every later one, ``--to STAGE`` stops after that one (Serve stays up after ``--to serve`` for a
later ``--from query``), so each stage can run as a job of its own on any node when ``output`` is
storage every node reaches. Stages: teacher, async_sgd, compress, moe, calibrate, serve, query, report
(``kind: lm``: teacher, compress, calibrate, serve, query, report).
"""

import argparse
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

from pydantic import BaseModel

from scaleforge.config import run_job
from scaleforge.config.pipeline import STAGES, PipelineJobConfig, Stage
from scaleforge.pipeline import Pipeline, RecordError, StageFailed, StageOrderError
from scaleforge.pipeline.preflight import check_runnable
from scaleforge.pipeline.runner import PipelineKind
from scaleforge.runtime import ensure_ray


@dataclass
class PipelineResult:
    records: BaseModel
    """The records of the config's kind."""
    report: Optional[str]
    """None when the run stopped before the last stage (``--to``)."""
    stopped_after: Stage
    kind: PipelineKind

    def summary(self) -> str:
        if self.report is None:
            names = self.kind.names
            following = names[names.index(self.stopped_after) + 1]
            return f"stopped after {self.stopped_after}; continue with --from {following}"
        return f"{self.kind.final_table(self.records)}\nreport: {self.report}"


def run_pipeline(
    cfg: PipelineJobConfig, redo_from: Optional[Stage] = None, stop_after: Optional[Stage] = None
) -> PipelineResult:
    # Reads the records it reuses: a stale one fails here, before Ray.
    pipeline = Pipeline(cfg, redo_from, stop_after=stop_after)
    if any(stage.uses_ray for stage in pipeline.to_run):
        # Logical CPUs for the Serve stage's many small deployments next to the training stages' workers.
        ensure_ray(min_cpus=8)
    records = pipeline.run()
    last = pipeline.stages[-1].name
    report = records.report.report if last == pipeline.kind.names[-1] else None
    return PipelineResult(records, report, last, pipeline.kind)


def main(argv: Optional[Sequence[str]] = None) -> int:
    # --from is this job's own option; --config and --set go on to the shared job parser.
    parser = argparse.ArgumentParser(
        prog="python -m jobs.pipeline", add_help=False, allow_abbrev=False, exit_on_error=False
    )
    parser.add_argument(
        "--from", dest="redo_from", choices=STAGES, help="redo this stage and every later one"
    )
    parser.add_argument("--to", dest="stop_after", choices=STAGES, help="stop after this stage")
    try:
        known, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
        return run_job(
            PipelineJobConfig,
            lambda cfg: run_pipeline(cfg, known.redo_from, known.stop_after),
            rest,
            prog="jobs.pipeline",
            preflight=check_runnable,
        )
    except (argparse.ArgumentError, RecordError, StageOrderError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except StageFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
