"""The main job: train, compress, calibrate, serve, query, report (``jobs.pipeline``)."""

from scaleforge.pipeline.records import Records
from scaleforge.pipeline.runner import PIPELINE, Pipeline, RecordError, StageFailed, StageOrderError

__all__ = ["PIPELINE", "Pipeline", "RecordError", "Records", "StageFailed", "StageOrderError"]
