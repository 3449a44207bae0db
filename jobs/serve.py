"""Serve the apps of a Ray Serve config file, after validating it (same file as ``serve run``).

    python -m jobs.serve --config configs/serve.yaml [--set http_options.port=8123 ...]

The config is checked (schema, artifacts, shapes) before Ray starts; then every app is deployed
on the cluster (``RAY_ADDRESS``, or an embedded local Ray) and the job blocks until Ctrl-C.
"""

import sys
from typing import Optional, Sequence

from scaleforge.config import ServeConfig, run_job
from scaleforge.deploy import AppCheckError, serve_until_interrupted


def _serve(cfg: ServeConfig) -> str:
    try:
        return serve_until_interrupted(cfg)
    except AppCheckError as err:  # raised before Ray starts: a config error, exit 2 like the schema's
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_job(ServeConfig, _serve, argv, prog="jobs.serve")


if __name__ == "__main__":
    sys.exit(main())
