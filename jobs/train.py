"""Training on Ray Train: data parallel, or model parallel with a ``parallel:`` section.

    python -m jobs.train --config configs/train_dp.yaml [--set optim.epochs=5 ...]
    python -m jobs.train --config configs/train_tp.yaml [--set parallel.tp=1 --set parallel.pp=2 ...]
    python -m jobs.train --config configs/train_lm_1b.yaml --plan   # memory per device of each layout
    ray job submit --working-dir . --runtime-env-json '{"py_modules": ["platform/scaleforge"]}' \
        -- python -m jobs.train --config configs/train_dp.yaml

``--plan`` allocates nothing and starts no Ray: it prints the parameter, gradient, optimiser and
activation memory per device of every layout of the job's workers, and exits 2 when the job's own
layout does not fit ``scaling.device_memory_gb``.
"""

import sys
from typing import Optional, Sequence

from scaleforge.config import TrainJobConfig, run_job


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--plan" in args:
        args.remove("--plan")
        return run_job(
            TrainJobConfig,
            "scaleforge.train.plan:plan_verdict",
            args,
            prog="jobs.train",
            preflight="scaleforge.train.plan:print_plan",
        )
    return run_job(
        TrainJobConfig,
        "scaleforge.train:run_training",
        args,
        prog="jobs.train",
        preflight="scaleforge.train.preflight:check_runnable",
    )


if __name__ == "__main__":
    sys.exit(main())
