"""Compression of a trained model artifact with an ordered recipe (distill, prune, low_rank, quantize,
export).

    python -m jobs.compress --config configs/compress.yaml [--set output=/abs/path ...]
    ray job submit --working-dir . --runtime-env-json '{"py_modules": ["platform/scaleforge"]}' \
        -- python -m jobs.compress --config configs/compress.yaml
"""

import sys
from typing import Optional, Sequence

from scaleforge.config import CompressJobConfig, run_job


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_job(
        CompressJobConfig,
        "scaleforge.compress.run:run_compression",
        argv,
        prog="jobs.compress",
        preflight="scaleforge.compress.preflight:check_runnable",
    )


if __name__ == "__main__":
    sys.exit(main())
