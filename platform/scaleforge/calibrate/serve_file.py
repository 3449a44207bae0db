"""``jobs.calibrate``: a Serve config's cascade calibrated, its thresholds written back into the file.

This is the standalone job's I/O around :func:`scaleforge.calibrate.cascade.calibrate_cascade`; the
main job's calibrate stage calls that function directly and keeps the thresholds in its record.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Union

import yaml

from scaleforge.calibrate.cascade import CascadeCalibration, calibrate_cascade
from scaleforge.config.calibrate import CalibrateConfig
from scaleforge.config.loader import ConfigError
from scaleforge.config.serve import ServeConfig
from scaleforge.data.preflight import check_files
from scaleforge.routers import CascadeEntry
from scaleforge.storage import is_file, read_text, write_atomic


@dataclass
class CalibratedServeFile:
    """What ``jobs.calibrate`` did: the cascade, its calibration, and the file it wrote."""

    cascade: str
    calibration: CascadeCalibration
    written_to: Union[Path, str]

    def summary(self) -> str:
        return (
            f"cascade '{self.cascade}': thresholds {self.calibration.thresholds}\n"
            f"{self.calibration.summary()}\nwritten to {self.written_to}"
        )


def check_runnable(cfg: CalibrateConfig) -> None:
    """Pre-flight of ``jobs.calibrate``: the Serve config to calibrate and the data files exist.

    Raises:
        ConfigError: ``serve_config: '...' does not exist``, or the data file that is missing.
    """
    check_files(cfg.data)
    if not is_file(cfg.serve_config):
        raise ConfigError(f"serve_config: {cfg.serve_config!r} does not exist")


def calibrate_serve_file(cfg: CalibrateConfig) -> CalibratedServeFile:
    """Fit the thresholds of ``cfg``'s cascade and write them into the Serve config (atomically, its
    leading comment lines kept), or into ``cfg.output``."""
    text = read_text(cfg.serve_config)
    raw = yaml.safe_load(text)
    serve_cfg = ServeConfig.model_validate(raw)
    app_index, cascade_index, cascade = _find_cascade(serve_cfg, cfg)
    args = serve_cfg.applications[app_index].args
    calibration = calibrate_cascade(
        [args.model(s.model).artifact for s in cascade.stages], cascade.measure, cfg
    )
    stages = raw["applications"][app_index]["args"]["routers"][cascade_index]["stages"]
    for stage, threshold in zip(stages, calibration.thresholds):
        stage["threshold"] = threshold
    ServeConfig.model_validate(raw)
    target = write_atomic(
        cfg.output or cfg.serve_config, _header(text) + yaml.safe_dump(raw, sort_keys=False)
    )
    return CalibratedServeFile(cascade.name, calibration, target)


def _find_cascade(serve_cfg: ServeConfig, cfg: CalibrateConfig) -> tuple[int, int, CascadeEntry]:
    """(app index, index in the app's ``routers``, entry) of the cascade ``cfg`` names (default: the
    first app's first cascade)."""
    apps = serve_cfg.applications
    app_index = (
        next((i for i, a in enumerate(apps) if a.name == cfg.application), None) if cfg.application else 0
    )
    if app_index is None:
        raise ValueError(
            f"application: no app {cfg.application!r} in {cfg.serve_config} "
            f"(apps: {', '.join(a.name for a in apps)})"
        )
    routers = apps[app_index].args.routers
    cascades = [i for i, r in enumerate(routers) if isinstance(r, CascadeEntry)]
    if not cascades:
        raise ValueError(f"application {apps[app_index].name!r} in {cfg.serve_config} has no cascade")
    names = [routers[i].name for i in cascades]
    if cfg.cascade and cfg.cascade not in names:
        raise ValueError(
            f"cascade: no cascade {cfg.cascade!r} in app {apps[app_index].name!r} "
            f"(cascades: {', '.join(names)})"
        )
    index = cascades[names.index(cfg.cascade)] if cfg.cascade else cascades[0]
    return app_index, index, routers[index]


def _header(text: str) -> str:
    """The config's leading comment lines (the command that runs it), kept on rewrite."""
    lines = text.splitlines(keepends=True)
    first_other = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return "".join(lines[:first_other])
