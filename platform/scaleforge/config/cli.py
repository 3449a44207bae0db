"""The shared command line of every job: ``--config FILE [--set dotted.key=value ...]``."""

import argparse
import importlib
import sys
from typing import Callable, Optional, Sequence, TypeVar, Union

from pydantic import BaseModel

from scaleforge.config.loader import ConfigError, load_config

M = TypeVar("M", bound=BaseModel)

Lazy = Union[Callable, str]
"""A function, or ``"module:function"`` imported only when needed: a job names its run and pre-flight
this way so that a config that fails validation is reported in a fraction of a second, before torch
and Ray are imported."""


def import_object(path: str):
    """The object that ``path`` names, ``module:attribute`` or ``module.attribute``, imported as
    ``serve run`` imports an app.

    Raises:
        ImportError: the module or the attribute does not exist (naming which).
    """
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ImportError(f"{path!r}: module {module_name!r} has no {attribute!r}") from None


def resolve(target: Lazy) -> Callable:
    """``target`` itself, or the function that its ``"module:function"`` names."""
    return target if callable(target) else import_object(target)


def parse_job_config(
    schema: type[M], argv: Optional[Sequence[str]], prog: str, preflight: Optional[Lazy] = None
) -> M:
    """Parse the job's arguments, load its config and run its pre-flight check.

    Raises:
        ConfigError: the config cannot run (the caller prints it and exits 2).
    """
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=schema.__doc__)
    parser.add_argument("--config", required=True, help="YAML file that fills the job's schema")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one field, e.g. --set optim.lr=0.01 (repeatable)",
    )
    args = parser.parse_args(argv)
    return load_config(
        schema,
        args.config,
        args.overrides,
        None if preflight is None else lambda cfg: resolve(preflight)(cfg),
    )


def run_job(
    schema: type[M], job: Lazy, argv: Optional[Sequence[str]], prog: str, preflight: Optional[Lazy] = None
) -> int:
    """Validate the config, run its pre-flight (no Ray touched), then run ``job`` and print its summary.

    Args:
        schema: The job's config schema.
        job: Runs a valid config and returns a result (its ``summary()`` is printed); a function or
            ``"module:function"``.
        argv: Command-line arguments (default: ``sys.argv[1:]``).
        prog: The job's module, for ``--help``.
        preflight: The job's ``check_runnable(cfg)`` (or ``"module:function"``): raises ConfigError when
            the run cannot start.

    Returns:
        0 on success, 2 when the config is invalid or cannot run (message on stderr, no traceback).
    """
    try:
        config = parse_job_config(schema, argv, prog, preflight)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = resolve(job)(config)
    print(result.summary() if hasattr(result, "summary") else result)
    return 0
