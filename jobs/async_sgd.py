"""SGD on parameter-server shards and asynchronous workers (Ray Core actors).

    python -m jobs.async_sgd --config configs/async_sgd.yaml [--set server.mode=ssp ...]
"""

import sys
from typing import Optional, Sequence

from scaleforge.config import AsyncSGDConfig, run_job
from scaleforge.paramserver import run_async_sgd
from scaleforge.paramserver.preflight import check_runnable


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_job(AsyncSGDConfig, run_async_sgd, argv, prog="jobs.async_sgd", preflight=check_runnable)


if __name__ == "__main__":
    sys.exit(main())
