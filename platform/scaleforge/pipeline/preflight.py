"""Pre-flight of the main job: every stage config that can be checked now is, before Ray starts."""

from pathlib import Path

from scaleforge.config.async_sgd import AsyncSGDConfig
from scaleforge.config.loader import ConfigError, load_config
from scaleforge.config.pipeline import PipelineConfig
from scaleforge.config.schema import TrainJobConfig
from scaleforge.paramserver.preflight import check_runnable as check_async_sgd
from scaleforge.storage import check_fields, describe, is_file
from scaleforge.train.preflight import check_runnable as check_training


def check_runnable(cfg: PipelineConfig) -> None:
    """Load and pre-flight the training stages' configs (teacher, async_sgd, moe); the later stages
    need earlier stages' artifacts, so only their config files (and ``placement.hwbench``) must exist.

    Raises:
        ConfigError: ``stage <name>: <that config's error>`` or ``<stage>.config: '...' does not exist``.
    """
    check_fields({"output": cfg.output})
    stages = (
        ("teacher", TrainJobConfig, check_training),
        ("async_sgd", AsyncSGDConfig, check_async_sgd),
        ("moe", TrainJobConfig, check_training),
    )
    for name, schema, preflight in stages:
        spec = getattr(cfg, name)
        try:
            load_config(schema, spec.config, spec.set, preflight=preflight)
        except ConfigError as err:
            raise ConfigError(f"stage {name}: {err}") from None
    for name in ("compress", "calibrate", "serve"):
        if not Path(getattr(cfg, name).config).is_file():
            raise ConfigError(f"{name}.config: {getattr(cfg, name).config!r} does not exist")
    hwbench = cfg.placement.hwbench
    if hwbench:
        check_fields({"placement.hwbench": hwbench})
        if not is_file(hwbench):
            raise ConfigError(
                f"placement.hwbench: {describe(hwbench)!r} does not exist (run python -m jobs.hwbench)"
            )
