"""Data-parallel training on Ray Train.

    python -m jobs.train --config configs/train_dp.yaml [--set optim.epochs=5 ...]
    ray job submit --working-dir . --runtime-env-json '{"py_modules": ["platform/scaleforge"]}' \
        -- python -m jobs.train --config configs/train_dp.yaml
"""

import sys
from typing import Optional, Sequence

from scaleforge.config import TrainJobConfig, run_job
from scaleforge.distributed.dp import run_training


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_job(TrainJobConfig, run_training, argv, prog="jobs.train")


if __name__ == "__main__":
    sys.exit(main())
