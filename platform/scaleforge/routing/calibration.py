"""Offline calibration of a served cascade: thresholds from validation data, written into the Serve config.

``jobs.calibrate`` runs :func:`calibrate_cascade` after the pre-flight :func:`check_runnable`. It
loads the stages exactly as the serving deployments do
(:func:`scaleforge.artifacts.servable.load_servable`), applies the same policy
(:mod:`scaleforge.routing.cascade`), and reports the result on the part of the held-out split it
did not calibrate on.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np
import torch
import yaml

from scaleforge.artifacts.servable import load_servable
from scaleforge.config.calibrate import CalibrateConfig
from scaleforge.config.loader import ConfigError
from scaleforge.config.routers import CascadeEntry
from scaleforge.config.serve import ServeConfig, finite_or_inf
from scaleforge.data import load_arrays
from scaleforge.data.preflight import check_files
from scaleforge.routing.cascade import calibrate_thresholds, simulate_cascade
from scaleforge.storage import is_file, read_text, write_atomic


@dataclass
class CalibrationResult:
    """Calibrated thresholds and what they give on held-out inputs not used to pick them."""

    cascade: str
    thresholds: list[float]
    answered_per_stage: list[float]
    accuracy: float
    last_stage_accuracy: float
    held_out: int
    written_to: Union[Path, str]

    def summary(self) -> str:
        shares = ", ".join(f"stage {i}: {share:.1%}" for i, share in enumerate(self.answered_per_stage))
        return (
            f"cascade '{self.cascade}': thresholds {self.thresholds}\n"
            f"held-out ({self.held_out} inputs): accuracy {self.accuracy:.4f} against "
            f"{self.last_stage_accuracy:.4f} for the last stage alone "
            f"({100 * (self.accuracy - self.last_stage_accuracy):+.2f} points); "
            f"answered at {shares}\nwritten to {self.written_to}"
        )


def check_runnable(cfg: CalibrateConfig) -> None:
    """Pre-flight of ``jobs.calibrate``: the Serve config to calibrate and the data files exist.

    Raises:
        ConfigError: ``serve_config: '...' does not exist``, or the data file that is missing.
    """
    check_files(cfg.data)
    if not is_file(cfg.serve_config):
        raise ConfigError(f"serve_config: {cfg.serve_config!r} does not exist")


def calibrate_cascade(cfg: CalibrateConfig) -> CalibrationResult:
    """Fit the thresholds of ``cfg``'s cascade and write them into the Serve config (atomically)."""
    raw = yaml.safe_load(read_text(cfg.serve_config))
    serve_cfg = ServeConfig.model_validate(raw)
    app_index, cascade_index, cascade = _find_cascade(serve_cfg, cfg)
    models = serve_cfg.applications[app_index].args
    stages = [load_servable(models.model(stage.model).artifact).module for stage in cascade.stages]
    calibration, held_out = _split(cfg)
    labels = [torch.from_numpy(y) for _, y in (calibration, held_out)]
    probs = [[_probs(model, x) for model in stages] for x, _ in (calibration, held_out)]
    thresholds = calibrate_thresholds(
        probs[0],
        labels[0],
        cascade.measure,
        target_accuracy=(
            _accuracy(probs[0][-1], labels[0]) - cfg.accuracy_loss if cfg.accuracy_loss is not None else None
        ),
        target_escalation=cfg.target_escalation,
        safety_sd=cfg.safety_sd,
    )
    thresholds = [finite_or_inf(t) for t in thresholds]
    result = simulate_cascade(probs[1], thresholds, cascade.measure)
    for stage, threshold in zip(
        raw["applications"][app_index]["args"]["routers"][cascade_index]["stages"], thresholds
    ):
        stage["threshold"] = threshold
    ServeConfig.model_validate(raw)
    target = write_atomic(
        cfg.output or cfg.serve_config, _header(cfg.serve_config) + yaml.safe_dump(raw, sort_keys=False)
    )
    return CalibrationResult(
        cascade.name,
        thresholds,
        [result.answered_at(i) for i in range(len(stages))],
        _accuracy(result.probs, labels[1]),
        _accuracy(probs[1][-1], labels[1]),
        len(labels[1]),
        target,
    )


def _find_cascade(serve_cfg: ServeConfig, cfg: CalibrateConfig) -> tuple[int, int, CascadeEntry]:
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


def split_rows(count: int, calibration_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a held-out split of ``count`` examples: (those that calibrate the thresholds, those
    that judge them). Whoever scores a calibrated cascade uses the second part only."""
    order = np.random.default_rng(seed).permutation(count)
    cut = int(round(count * calibration_fraction))
    return order[:cut], order[cut:]


def _split(cfg: CalibrateConfig):
    """(calibration, held-out) parts of the data's held-out split, shuffled with ``split_seed``."""
    arrays = load_arrays(cfg.data)
    rows = split_rows(len(arrays.y_test), cfg.calibration_fraction, cfg.split_seed)
    return [(arrays.x_test[part], arrays.y_test[part]) for part in rows]


@torch.inference_mode()
def _probs(model, x: np.ndarray) -> torch.Tensor:
    return model(torch.from_numpy(x)).softmax(dim=-1)


def _accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    return float((probs.argmax(dim=-1) == labels).float().mean())


def _header(path: str) -> str:
    """The config's leading comment lines (the command that runs it), kept on rewrite."""
    lines = read_text(path).splitlines(keepends=True)
    return "".join(
        line for line in lines[: next((i for i, text in enumerate(lines) if not text.startswith("#")), 0)]
    )
