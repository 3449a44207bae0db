"""The shared command line of every job: ``--config FILE [--set dotted.key=value ...]``."""

import argparse
import sys
from typing import Callable, Optional, Sequence, TypeVar

from pydantic import BaseModel

from scaleforge.config.loader import ConfigError, load_config

M = TypeVar("M", bound=BaseModel)


def parse_job_config(schema: type[M], argv: Optional[Sequence[str]], prog: str,
                     preflight: Optional[Callable[[M], None]] = None) -> M:
    """Parse the job's arguments, load its config and run its pre-flight check.

    Raises:
        ConfigError: the config cannot run (the caller prints it and exits 2).
    """
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=schema.__doc__)
    parser.add_argument("--config", required=True, help="YAML file that fills the job's schema")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one field, e.g. --set optim.lr=0.01 (repeatable)",
    )
    args = parser.parse_args(argv)
    return load_config(schema, args.config, args.overrides, preflight)


def run_job(schema: type[M], job: Callable[[M], object], argv: Optional[Sequence[str]], prog: str,
            preflight: Optional[Callable[[M], None]] = None) -> int:
    """Validate the config, run its pre-flight (no Ray touched), then run ``job`` and print its summary.

    Args:
        schema: The job's config schema.
        job: Runs a valid config and returns a result (its ``summary()`` is printed).
        argv: Command-line arguments (default: ``sys.argv[1:]``).
        prog: The job's module, for ``--help``.
        preflight: The job's ``check_runnable(cfg)``: raises ConfigError when the run cannot start.

    Returns:
        0 on success, 2 when the config is invalid or cannot run (message on stderr, no traceback).
    """
    try:
        config = parse_job_config(schema, argv, prog, preflight)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = job(config)
    print(result.summary() if hasattr(result, "summary") else result)
    return 0
