"""The main job: train, compress, calibrate, serve, query, report (``jobs.pipeline``)."""

from scaleforge.pipeline.stages import Pipeline, StageFailed

__all__ = ["Pipeline", "StageFailed"]
