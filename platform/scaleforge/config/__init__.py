"""Typed job configs: pydantic schemas filled from YAML, with dotted ``--set`` overrides.

Schemas hold fields and the rules among them; building one reads no file but its YAML and imports
no torch. Each job's ``check_runnable`` pre-flight (next to its domain) checks the rest.
"""

from scaleforge.config.async_sgd import AsyncSGDConfig
from scaleforge.config.calibrate import CalibrateConfig
from scaleforge.config.cli import parse_job_config, run_job
from scaleforge.config.compress import CompressJobConfig
from scaleforge.config.hwbench import HWBenchConfig
from scaleforge.config.loader import ConfigError, load_config
from scaleforge.config.pipeline import PipelineConfig, PipelineJobConfig
from scaleforge.config.pipeline_lm import LMPipelineConfig
from scaleforge.config.schema import TrainJobConfig
from scaleforge.config.serve import ServeConfig

JOB_SCHEMAS = {
    "jobs.train": TrainJobConfig,
    "jobs.async_sgd": AsyncSGDConfig,
    "jobs.compress": CompressJobConfig,
    "jobs.serve": ServeConfig,
    "jobs.calibrate": CalibrateConfig,
    "jobs.hwbench": HWBenchConfig,
    "jobs.pipeline": PipelineJobConfig,
}
"""Each job module and the schema of its ``--config`` file (``jobs.pipeline``'s picks a subclass by
``kind``)."""

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
