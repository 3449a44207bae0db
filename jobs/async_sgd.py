"""SGD on parameter-server shards and asynchronous workers (Ray Core actors).

python -m jobs.async_sgd --config configs/async_sgd.yaml [--set server.mode=ssp ...]
"""

import sys
from typing import Optional, Sequence

from scaleforge.config import AsyncSGDConfig, run_job


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_job(
        AsyncSGDConfig,
        "scaleforge.paramserver:run_async_sgd",
        argv,
        prog="jobs.async_sgd",
        preflight="scaleforge.paramserver.preflight:check_runnable",
    )


if __name__ == "__main__":
    sys.exit(main())
