"""Training on Ray Train: data parallel, or model parallel with a ``parallel:`` section.

    python -m jobs.train --config configs/train_dp.yaml [--set optim.epochs=5 ...]
    python -m jobs.train --config configs/train_tp.yaml [--set parallel.tp=1 --set parallel.pp=2 ...]
    ray job submit --working-dir . --runtime-env-json '{"py_modules": ["platform/scaleforge"]}' \
        -- python -m jobs.train --config configs/train_dp.yaml
"""

import sys
from typing import Optional, Sequence

from scaleforge.config import TrainJobConfig, run_job


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_job(TrainJobConfig, "scaleforge.train:run_training", argv, prog="jobs.train",
                   preflight="scaleforge.train.preflight:check_runnable")


if __name__ == "__main__":
    sys.exit(main())
