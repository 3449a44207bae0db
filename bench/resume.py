"""A worker killed mid-epoch without notice, in every layout, against the same run left alone.

    .venv/bin/python bench/resume.py      (about 20 minutes on 2 idle cores)

For each layout (data parallel on ``configs/train_dp.yaml``, expert parallel on
``configs/train_moe.yaml``, and the language model of ``configs/train_lm_tiny.yaml`` split by
``parallel.fsdp=2`` and by ``parallel.pp=2``) the shipped config runs twice on one local Ray, with
step checkpoints every 50 steps: once uninterrupted, once with the last rank killed before step 173
(``fault.kill_worker_at_step``), 22 steps after the checkpoint of step 150.

Bars, per layout: the resumed run repeats fewer than 50 steps; after the checkpoint its step log has
each step once, to the end; every step's loss equals the uninterrupted run's (same data order,
weights, optimiser and RNG state: the tolerance is float arithmetic's, 1e-4 relative); and the final
score equals the uninterrupted run's within one test example (classifiers) or 0.001 bits/byte (the
language model), far inside the spread between seeds.

Prints each bar with met/missed; exit status 1 if one was missed.
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from bars import print_bars  # noqa: E402
from jobs_here import job_folder  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge.config import TrainJobConfig, load_config  # noqa: E402
from scaleforge.runtime import ensure_ray  # noqa: E402
from scaleforge.train import run_training  # noqa: E402
from scaleforge.train.preflight import check_runnable  # noqa: E402

EVERY, KILL = 50, 173
LAYOUTS = {
    "DDP": ("train_dp.yaml", []),
    "EP": ("train_moe.yaml", ["parallel.ep=2"]),
    "LM fsdp=2": ("train_lm_tiny.yaml", ["parallel.fsdp=2"]),
    "LM pp=2": ("train_lm_tiny.yaml", ["parallel.pp=2"]),
}


def _run(tmp: Path, name: str, config: str, overrides: list[str], kill: bool):
    cfg = load_config(
        TrainJobConfig,
        ROOT / "configs" / config,
        [
            *overrides,
            f"run.checkpoint_every_steps={EVERY}",
            "run.max_failures=1",
            *([f"fault.kill_worker_at_step={KILL}"] if kill else []),
            f"run.name={name}",
            f"run.storage_path={tmp / 'runs'}",
            f"artifact.dir={tmp / name}",
        ],
        check_runnable,
    )
    started = time.perf_counter()
    result = run_training(cfg)
    print(f"{name}: {time.perf_counter() - started:.0f} s, {len(result.step_log)} steps logged", flush=True)
    return cfg, result


def _score(cfg: TrainJobConfig, result) -> tuple[str, float, float]:
    """The run's final score, its name, and the bar's tolerance."""
    if "bits_per_byte" in result.metrics:
        return "bits/byte", result.metrics["bits_per_byte"], 1e-3
    one_example = 1.0 / round(cfg.data.num_samples * cfg.data.test_fraction)
    return "test accuracy", result.metrics["test_accuracy"], one_example


def _rows(layout: str, cfg: TrainJobConfig, plain, killed) -> list:
    checkpoint = killed.metrics.get("resumed_from_step", 0)
    last_attempt = [e for e in killed.step_log if e["attempt_from_step"] == checkpoint and checkpoint]
    total = plain.step_log[-1]["step"]
    once = [e["step"] for e in last_attempt] == list(range(checkpoint + 1, total + 1))
    final = {e["step"]: e["loss"] for e in killed.step_log}  # a repeated step: its last run
    reference = {e["step"]: e["loss"] for e in plain.step_log}
    worst = max(abs(final[s] - loss) / max(abs(loss), 1e-12) for s, loss in reference.items() if s in final)
    name, score, tolerance = _score(cfg, killed)
    _, plain_score, _ = _score(cfg, plain)
    return [
        (
            f"{layout}: steps run twice",
            f"{killed.repeated_steps()} (resumed from step {checkpoint}, killed before {KILL})",
            f"< {EVERY}",
            0 < checkpoint and killed.repeated_steps() < EVERY,
        ),
        (
            f"{layout}: step log after the checkpoint",
            f"steps {checkpoint + 1}..{total} once each" if once else "a step skipped or run twice",
            "each step once",
            once and set(final) == set(reference),
        ),
        (
            f"{layout}: loss per step vs uninterrupted",
            f"max relative gap {worst:.1e} over {len(reference)} steps",
            "<= 1e-4",
            worst <= 1e-4,
        ),
        (
            f"{layout}: final {name}",
            f"{score:.4f} vs {plain_score:.4f} uninterrupted ({score - plain_score:+.4f})",
            f"within {tolerance:.4g}",
            abs(score - plain_score) <= tolerance,
        ),
    ]


def main() -> int:
    check_and_print()
    rows = []
    with job_folder("resume") as tmp:
        ensure_ray(min_cpus=4)
        for layout, (config, overrides) in LAYOUTS.items():
            tag = layout.replace(" ", "_").replace("=", "")
            cfg, plain = _run(tmp, f"{tag}_plain", config, overrides, kill=False)
            _, killed = _run(tmp, f"{tag}_killed", config, overrides, kill=True)
            rows += _rows(layout, cfg, plain, killed)
    return print_bars(rows, "killed without notice")


if __name__ == "__main__":
    sys.exit(main())
