"""The models of bench/serving.py: trained once and cached, their forward cost, and each cascade's
threshold calibrated with ``jobs.calibrate``'s defaults through the library's pure functions."""

import sys
import time

import numpy as np
import torch

from scaleforge.artifacts.servable import load_servable
from scaleforge.config.calibrate import CalibrateConfig
from scaleforge.quickfit import fit_and_save
from scaleforge.routing import calibrate_thresholds, simulate_cascade
from serving_parts.common import BATCH, CACHE, STUDENT, TEACHER, THREADS
from serving_parts.early_exit import exit_logits, trained_early_exit

ACCURACY_LOSS = CalibrateConfig.model_fields["max_accuracy_loss"].default
SAFETY_SD = CalibrateConfig.model_fields["safety_sd"].default


def trained(data) -> dict[str, str]:
    """Each model's artifact folder (student, teacher, early-exit), trained where not cached."""
    paths = {}
    for role, spec, epochs in (("student", STUDENT, 6), ("teacher", TEACHER, 3)):
        path = CACHE / role
        if not (path / "manifest.json").is_file():
            print(f"training the {role} (cached in {path}) ...", file=sys.stderr, flush=True)
            fit_and_save(path, spec, data, epochs=epochs)
        paths[role] = str(path)
    paths["early-exit"] = trained_early_exit(data)
    return paths


def cost_ms(path: str, x: np.ndarray) -> float:
    """Median forward time of one batch of ``BATCH`` on one thread."""
    torch.set_num_threads(THREADS)
    model, batch = load_servable(path).module, torch.from_numpy(x[:BATCH])
    times = []
    with torch.inference_mode():
        for _ in range(11):
            start = time.perf_counter()
            model(batch)
            times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times[1:]))


def exit_probs(paths, x: np.ndarray) -> dict[str, list[torch.Tensor]]:
    """Both stages' probabilities for every input: the two-model cascade's (student, teacher) and
    the early-exit network's (side exit, final exit)."""
    inputs = torch.from_numpy(x)
    with torch.inference_mode():
        cascade = [load_servable(paths[r]).module(inputs).softmax(1) for r in ("student", "teacher")]
        early = [logits.softmax(1) for logits in exit_logits(paths["early-exit"], inputs)]
    return {"cascade": cascade, "early exit": early}


def calibrated_thresholds(probs: dict[str, list[torch.Tensor]], y: np.ndarray) -> dict[str, float]:
    """Each cascade's threshold, calibrated as ``jobs.calibrate`` calibrates by default: 0.5 point below
    the teacher (or below its own last stage, where that is lower), 2 standard deviations in reserve."""
    labels = torch.from_numpy(y)
    last = {name: float((stages[1].argmax(1) == labels).float().mean()) for name, stages in probs.items()}
    return {
        name: calibrate_thresholds(
            stages,
            labels,
            "max_prob",
            safety_sd=SAFETY_SD,
            target_accuracy=min(last["cascade"], last[name]) - ACCURACY_LOSS,
        )[0]
        for name, stages in probs.items()
    }


def print_exit_curves(probs: dict[str, list[torch.Tensor]], y: np.ndarray) -> None:
    """Accuracy against the share of inputs answered at the first stage, threshold by threshold (held out)."""
    labels = torch.from_numpy(y)
    print("accuracy / share answered at stage 0 (held out), by threshold on max_prob")
    thresholds = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 1.01)
    print(f"  {'threshold':24s}" + "".join(f"{t:>14g}" for t in thresholds))
    for name, stages in probs.items():
        cells = []
        for threshold in thresholds:
            result = simulate_cascade(stages, [threshold], "max_prob")
            cells.append(
                f"{float((result.predictions == labels).float().mean()):.4f} / {result.answered_at(0):4.0%}"
            )
        print(f"  {name:24s}" + "".join(f"{cell:>14s}" for cell in cells))
