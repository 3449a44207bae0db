"""What step checkpoints cost the language model: every 50 steps to a bucket, uploaded in the background
(``run.checkpoint_upload: async``) or while every worker waits (``sync``), against none.

    .venv/bin/python bench/checkpoint_upload.py      (about 10 minutes on 2 idle cores)

``configs/train_lm_small.yaml`` (2 data-parallel workers on Ray Train) on its first 800 kB of training
bytes: one epoch of about 390 steps, checkpoints (weights, AdamW state, trainer state, each rank's RNG:
about 10 MB) to a bucket of a real S3 server (moto's, on 127.0.0.1: a cloud's object store, without
the network). The three variants read the same ordered batches and send the same step log, so they
differ in checkpoints only ("none" sets ``run.checkpoint_every_steps`` past the last step).

Step time is the training time of the epoch (``epoch_s``: the steps, their checkpoints and any wait
for an upload; the validation pass is not in it) over its steps. Three rounds, the order of the
variants rotated each round; medians, with the spread (max - min) across rounds. Bar: the async
variant costs at most 10% of step time against none; sync is reported beside it.
"""

import statistics
import sys
from contextlib import redirect_stdout
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "platform"), str(REPO)]

from bars import print_bars  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge import storage  # noqa: E402
from scaleforge.config import TrainJobConfig, load_config  # noqa: E402
from scaleforge.storage.local_s3 import LocalS3  # noqa: E402

ROUNDS, EVERY, BAR = 3, 50, 0.10
VARIANTS = {
    "none": ["run.checkpoint_every_steps=1000000"],
    "sync": [f"run.checkpoint_every_steps={EVERY}", "run.checkpoint_upload=sync"],
    "async": [f"run.checkpoint_every_steps={EVERY}", "run.checkpoint_upload=async"],
}


def _run(variant: str, bucket: str, round_: int) -> dict:
    """One training run of ``variant``; its step time and the checkpoints it left in the bucket."""
    from scaleforge.train import run_training

    runs = storage.join(bucket, f"{variant}-{round_}")
    cfg = load_config(
        TrainJobConfig,
        REPO / "configs/train_lm_small.yaml",
        [
            "data.max_train_bytes=800000",
            "run.log_every_steps=null",
            "run.keep_checkpoints=2",
            f"run.storage_path={storage.join(runs, 'runs')}",
            f"artifact.dir={storage.join(runs, 'artifact')}",
            *VARIANTS[variant],
        ],
    )
    result = run_training(cfg)
    steps = len(result.step_log)
    seconds = sum(epoch["epoch_s"] for epoch in result.history)
    return {"step_ms": 1000 * seconds / steps, "steps": steps}


def main() -> int:
    check_and_print()
    import ray

    measured: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    with LocalS3() as s3, redirect_stdout(sys.stderr):
        ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        try:
            for round_ in range(ROUNDS):
                for variant in names[round_ % len(names) :] + names[: round_ % len(names)]:
                    run = _run(variant, s3.uri("checkpoints"), round_)
                    measured[variant].append(run)
                    print(f"round {round_ + 1} {variant}: {run['step_ms']:.1f} ms/step", flush=True)
        finally:
            ray.shutdown()
    return _report(measured)


def _report(measured: dict[str, list[dict]]) -> int:
    step = {name: [run["step_ms"] for run in runs] for name, runs in measured.items()}
    median = {name: statistics.median(values) for name, values in step.items()}
    print(f"{'variant':<8}{'ms/step (median)':>18}{'spread':>9}{'vs none':>9}  rounds")
    for name, values in step.items():
        print(
            f"{name:<8}{median[name]:>18.1f}{max(values) - min(values):>9.1f}"
            f"{median[name] / median['none'] - 1:>+9.1%}  {', '.join(f'{v:.1f}' for v in values)}"
        )
    steps = {run["steps"] for runs in measured.values() for run in runs}
    print(f"steps per run: {sorted(steps)}; a checkpoint every {EVERY} steps")
    cost = median["async"] / median["none"] - 1
    spread = max(step["none"]) - min(step["none"])
    rows = [
        (
            f"async upload every {EVERY} steps",
            f"{cost:+.1%} step time ({median['async']:.1f} vs {median['none']:.1f} ms, none's spread "
            f"{spread:.1f} ms); sync {median['sync'] / median['none'] - 1:+.1%}",
            f"<= +{BAR:.0%}",
            cost <= BAR,
        )
    ]
    return print_bars(rows, "checkpoints")


if __name__ == "__main__":
    sys.exit(main())
