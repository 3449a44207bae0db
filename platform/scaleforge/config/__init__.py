"""Typed job configs: pydantic schemas filled from YAML, with dotted ``--set`` overrides.

Schemas hold fields and the rules among them; building one reads no file but its YAML and imports
no torch. Each job's ``check_runnable`` pre-flight (next to its domain) checks the rest.
"""

from typing import Any

from scaleforge.lazy import lazy_exports

_HOMES = {
    "AsyncSGDConfig": "scaleforge.config.async_sgd",
    "CalibrateConfig": "scaleforge.config.calibrate",
    "CompressJobConfig": "scaleforge.config.compress",
    "ConfigError": "scaleforge.config.loader",
    "HWBenchConfig": "scaleforge.config.hwbench",
    "LMPipelineConfig": "scaleforge.config.pipeline_lm",
    "load_config": "scaleforge.config.loader",
    "parse_job_config": "scaleforge.config.cli",
    "PipelineConfig": "scaleforge.config.pipeline",
    # Taken from the module of a kind of pipeline, which imports the base: ``kind`` picks among the
    # subclasses imported by then.
    "PipelineJobConfig": "scaleforge.config.pipeline_lm",
    "run_job": "scaleforge.config.cli",
    "ServeConfig": "scaleforge.config.serve",
    "TrainJobConfig": "scaleforge.config.schema",
}
"""Where each export lives: imported on first use, so that a process that needs one schema (a Serve
replica needs the serve config's) does not build every job's (about 0.2 s of CPU, pydantic's)."""

_JOBS = {
    "jobs.train": "TrainJobConfig",
    "jobs.async_sgd": "AsyncSGDConfig",
    "jobs.compress": "CompressJobConfig",
    "jobs.serve": "ServeConfig",
    "jobs.calibrate": "CalibrateConfig",
    "jobs.hwbench": "HWBenchConfig",
    "jobs.pipeline": "PipelineJobConfig",
}
"""Each job module and the schema of its ``--config`` file (``jobs.pipeline``'s picks a subclass by
``kind``): ``JOB_SCHEMAS`` maps them to the classes."""
_exports = lazy_exports(__name__, _HOMES)


def __getattr__(name: str) -> Any:
    if name == "JOB_SCHEMAS":
        return {job: _exports(schema) for job, schema in _JOBS.items()}
    return _exports(name)


__all__ = [
    "AsyncSGDConfig",
    "CalibrateConfig",
    "CompressJobConfig",
    "ConfigError",
    "HWBenchConfig",
    "JOB_SCHEMAS",
    "LMPipelineConfig",
    "load_config",
    "parse_job_config",
    "PipelineConfig",
    "PipelineJobConfig",
    "run_job",
    "ServeConfig",
    "TrainJobConfig",
]
