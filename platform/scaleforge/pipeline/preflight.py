"""Pre-flight of the main job: every stage config that can be checked now is, before Ray starts."""

from pathlib import Path

from scaleforge.config.async_sgd import AsyncSGDConfig
from scaleforge.config.calibrate import CalibrateConfig
from scaleforge.config.loader import ConfigError, load_config
from scaleforge.config.pipeline import PipelineJobConfig
from scaleforge.config.pipeline_lm import LMPipelineConfig
from scaleforge.config.schema import TrainJobConfig
from scaleforge.config.serve import ServeConfig
from scaleforge.paramserver.preflight import check_runnable as check_async_sgd
from scaleforge.storage import check_fields, describe, is_file
from scaleforge.train.preflight import check_runnable as check_training


def check_runnable(cfg: PipelineJobConfig) -> None:
    """Load and pre-flight the training stages' configs (teacher, async_sgd, moe); the later stages
    need earlier stages' artifacts, so only their config files (and ``placement.hwbench``) must exist.
    ``kind: lm``: :func:`check_lm_runnable`.

    Raises:
        ConfigError: ``stage <name>: <that config's error>`` or ``<stage>.config: '...' does not exist``.
    """
    check_fields({"output": cfg.output})
    if isinstance(cfg, LMPipelineConfig):
        check_lm_runnable(cfg)
        return
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


def check_lm_runnable(cfg: LMPipelineConfig) -> None:
    """The teacher's config pre-flighted as ``jobs.train`` would; the compress config file exists; the
    calibrate and serve configs load, the serve config has an entry for every name in ``serve.models``
    and serves the generator whose draft length the calibrate stage chooses.

    Raises:
        ConfigError: naming the stage's config and what is wrong with it.
    """
    from scaleforge.pipeline.lm import calibrated_generator, routers_over

    try:
        load_config(TrainJobConfig, cfg.teacher.config, cfg.teacher.set, preflight=check_training)
    except ConfigError as err:
        raise ConfigError(f"stage teacher: {err}") from None
    if not Path(cfg.compress.config).is_file():
        raise ConfigError(f"compress.config: {cfg.compress.config!r} does not exist")
    try:
        calibrate = load_config(CalibrateConfig, cfg.calibrate.config, cfg.calibrate.set)
        template = load_config(ServeConfig, cfg.serve.config, cfg.serve.set).applications[0].args
    except ConfigError as err:
        raise ConfigError(f"stage calibrate or serve: {err}") from None
    missing = sorted(set(cfg.serve.models) - {m.name for m in template.models})
    if missing:
        raise ConfigError(f"serve.models: {missing} have no model entry in {cfg.serve.config}")
    served = template.model_copy(update={"routers": routers_over(template, set(cfg.serve.models))})
    try:
        calibrated_generator(calibrate, served, cfg.serve.config)
    except ValueError as err:
        raise ConfigError(f"calibrate.config ({cfg.calibrate.config}): {err}") from None
