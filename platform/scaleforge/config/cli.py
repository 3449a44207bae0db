"""The shared command line of every job: ``--config FILE [--set dotted.key=value ...]``."""

import argparse
import sys
from typing import Callable, Optional, Sequence, TypeVar

from pydantic import BaseModel

from scaleforge.config.loader import ConfigError, load_config

M = TypeVar("M", bound=BaseModel)


def parse_job_config(schema: type[M], argv: Optional[Sequence[str]], prog: str) -> M:
    """Parse the job's arguments and load its config.

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
    return load_config(schema, args.config, args.overrides)


def run_job(schema: type[M], job: Callable[[M], object], argv: Optional[Sequence[str]], prog: str) -> int:
    """Validate the config (no Ray touched), then run ``job`` and print its summary.

    Returns:
        0 on success, 2 when the config is invalid (message on stderr, no traceback).
    """
    try:
        config = parse_job_config(schema, argv, prog)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = job(config)
    print(result.summary() if hasattr(result, "summary") else result)
    return 0
