"""Serve the apps of a Ray Serve config file, after validating it (same file as ``serve run``).

    python -m jobs.serve --config configs/serve.yaml [--set http_options.port=8123 ...]

The config is checked (schema, artifacts, shapes, the app builder's import path) before Ray starts;
then every app is deployed on the cluster (``RAY_ADDRESS``, or an embedded local Ray) and the job
blocks until Ctrl-C.
"""

import sys
from typing import Optional, Sequence

from scaleforge.config import ServeConfig, run_job


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_job(
        ServeConfig,
        "scaleforge.deployment.deploy:serve_until_interrupted",
        argv,
        prog="jobs.serve",
        preflight="scaleforge.deployment.deploy:check_applications",
    )


if __name__ == "__main__":
    sys.exit(main())
