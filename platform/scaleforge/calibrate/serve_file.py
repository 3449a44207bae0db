"""``jobs.calibrate``: a Serve config's cascade calibrated, its thresholds written back into the file;
or a generator's draft length (``generator:``), its ``draft_tokens`` written back.

This is the standalone job's I/O around :func:`scaleforge.calibrate.cascade.calibrate_cascade` and
:func:`scaleforge.calibrate.drafts.calibrate_drafts`; the main job's calibrate stage calls them
directly and keeps the result in its record.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import yaml

from scaleforge.calibrate.cascade import CascadeCalibration, calibrate_cascade
from scaleforge.calibrate.drafts import DraftCalibration, calibrate_drafts
from scaleforge.config.calibrate import CalibrateConfig
from scaleforge.config.loader import ConfigError
from scaleforge.config.serve import ServeConfig
from scaleforge.data.preflight import check_files
from scaleforge.routers import CascadeEntry, GeneratorEntry, RouterEntry
from scaleforge.routers.generator import LOOKUP
from scaleforge.storage import is_file, read_text, write_atomic


@dataclass
class CalibratedServeFile:
    """What ``jobs.calibrate`` did: the cascade, its calibration, and the file it wrote."""

    router: str
    calibration: Union[CascadeCalibration, DraftCalibration]
    written_to: Union[Path, str]

    def summary(self) -> str:
        if isinstance(self.calibration, DraftCalibration):
            head = f"generator '{self.router}': draft_tokens {self.calibration.chosen}"
        else:
            head = f"cascade '{self.router}': thresholds {self.calibration.thresholds}"
        return f"{head}\n{self.calibration.summary()}\nwritten to {self.written_to}"


def check_runnable(cfg: CalibrateConfig) -> None:
    """Pre-flight of ``jobs.calibrate``: the Serve config to calibrate and the data files exist.

    Raises:
        ConfigError: ``serve_config: '...' does not exist``, or the data file that is missing.
    """
    check_files(cfg.data)
    if not is_file(cfg.serve_config):
        raise ConfigError(f"serve_config: {cfg.serve_config!r} does not exist")
    if cfg.generator:
        try:
            _, _, router = _find_router(
                ServeConfig.model_validate(yaml.safe_load(read_text(cfg.serve_config))),
                cfg,
                GeneratorEntry,
                cfg.generator,
            )
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if router.drafter is None:
            raise ConfigError(
                f"generator: {cfg.generator!r} in {cfg.serve_config} has no drafter, so no draft length "
                "to calibrate"
            )


def calibrate_serve_file(cfg: CalibrateConfig) -> CalibratedServeFile:
    """Fit the thresholds of ``cfg``'s cascade (or the draft length of its generator) and write them into
    the Serve config (atomically, its leading comment lines kept), or into ``cfg.output``."""
    text = read_text(cfg.serve_config)
    raw = yaml.safe_load(text)
    serve_cfg = ServeConfig.model_validate(raw)
    kind, name = (GeneratorEntry, cfg.generator) if cfg.generator else (CascadeEntry, cfg.cascade)
    app_index, router_index, router = _find_router(serve_cfg, cfg, kind, name)
    args = serve_cfg.applications[app_index].args
    entry = raw["applications"][app_index]["args"]["routers"][router_index]
    calibration = _calibrate(router, args, entry, cfg)
    ServeConfig.model_validate(raw)
    target = write_atomic(
        cfg.output or cfg.serve_config, _header(text) + yaml.safe_dump(raw, sort_keys=False)
    )
    return CalibratedServeFile(router.name, calibration, target)


def _calibrate(
    router: RouterEntry, args: Any, entry: dict, cfg: CalibrateConfig
) -> Union[CascadeCalibration, DraftCalibration]:
    """Calibrate ``router`` and write the result into its raw ``entry``."""
    if isinstance(router, GeneratorEntry):
        # The pre-flight refused a generator without a drafter.
        drafter = router.drafter if router.drafter == LOOKUP else args.model(router.drafter).artifact
        calibration = calibrate_drafts(args.model(router.model).artifact, drafter, cfg.draft)
        entry["draft_tokens"] = calibration.chosen
        entry.pop("draft_max_running", None)
        if calibration.draft_max_running is not None:
            entry["draft_max_running"] = calibration.draft_max_running
        return calibration
    calibration = calibrate_cascade(
        [args.model(s.model).artifact for s in router.stages], router.measure, cfg
    )
    for stage, threshold in zip(entry["stages"], calibration.thresholds):
        stage["threshold"] = threshold
    return calibration


def _find_router(
    serve_cfg: ServeConfig, cfg: CalibrateConfig, kind: type[RouterEntry], name: str | None
) -> tuple[int, int, RouterEntry]:
    """(app index, index in the app's ``routers``, entry) of the router of ``kind`` named ``name`` (default:
    the app's first of that kind; the app is ``cfg.application``, default the first)."""
    apps = serve_cfg.applications
    app_index = (
        next((i for i, a in enumerate(apps) if a.name == cfg.application), None) if cfg.application else 0
    )
    if app_index is None:
        raise ValueError(
            f"application: no app {cfg.application!r} in {cfg.serve_config} "
            f"(apps: {', '.join(a.name for a in apps)})"
        )
    word = kind.model_fields["kind"].default
    routers = apps[app_index].args.routers
    found = [i for i, r in enumerate(routers) if isinstance(r, kind)]
    if not found:
        raise ValueError(f"application {apps[app_index].name!r} in {cfg.serve_config} has no {word}")
    names = [routers[i].name for i in found]
    if name and name not in names:
        raise ValueError(
            f"{word}: no {word} {name!r} in app {apps[app_index].name!r} ({word}s: {', '.join(names)})"
        )
    index = found[names.index(name)] if name else found[0]
    return app_index, index, routers[index]


def _header(text: str) -> str:
    """The config's leading comment lines (the command that runs it), kept on rewrite."""
    lines = text.splitlines(keepends=True)
    first_other = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return "".join(lines[:first_other])
