"""YAML -> pydantic with dotted ``--set`` overrides; every failure is one readable ConfigError."""

import re
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from scaleforge import storage
from scaleforge.storage import StorageError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config that cannot run: the message names the file, the field and the problem."""


def job_of(path: Path) -> str:
    """The job that runs a config file: the ``# python -m jobs.<name>`` line it opens with."""
    header = re.search(r"^# python -m (jobs\.\w+)", Path(path).read_text(), re.MULTILINE)
    if not header:
        raise ConfigError(f"{path}: a config opens with the command that runs it (# python -m jobs.<name>)")
    return header.group(1)


def load_config(
    schema: type[M],
    path: str | Path,
    overrides: Sequence[str] = (),
    preflight: Optional[Callable[[M], None]] = None,
) -> M:
    """Read ``path``, apply ``key.sub=value`` overrides, validate against ``schema``, then pre-flight.

    Validation reads nothing but ``path``; ``preflight`` (the job's ``check_runnable``) then checks
    what the fields alone cannot: files, artifacts, data, that the model builds.

    Args:
        schema: The job's pydantic model (``extra="forbid"`` all the way down).
        path: A YAML file whose top level is a mapping of sections.
        overrides: ``dotted.key=value`` strings; values are parsed as YAML scalars/lists.
        preflight: Called with the valid config; raises ConfigError when the run cannot start.

    Raises:
        ConfigError: unreadable YAML, a bad override, a validation or a pre-flight failure, each
            line prefixed with the file (and overrides).
    """
    name = storage.describe(path) if storage.is_uri(path) else str(path)
    source = name + (f" (with --set {' '.join(overrides)})" if overrides else "")
    text = _read(path, name)
    path = Path(name)
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: invalid YAML{where}: {getattr(err, 'problem', err)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(raw).__name__}")
    for item in overrides:
        _apply_override(raw, item, path)
    try:
        config = schema.model_validate(raw)
    except ValidationError as err:
        raise ConfigError("\n".join(f"{source}: {line}" for line in _describe(err, raw))) from None
    if preflight is not None:
        try:
            preflight(config)
        except (ConfigError, StorageError) as err:
            raise ConfigError(f"{source}: {err}") from None
    return config


def _read(path: str | Path, name: str) -> str:
    """The YAML text of a local file or of an object under a URI (``s3://bucket/serve.yaml``)."""
    try:
        if storage.is_uri(path):
            found = storage.is_file(path)
        else:
            found = Path(path).is_file()
    except StorageError as err:
        raise ConfigError(str(err)) from None
    if not found:
        raise ConfigError(f"{name}: config file not found")
    return storage.read_text(path) if storage.is_uri(path) else Path(path).read_text()


def _apply_override(raw: dict, item: str, path: Path) -> None:
    """``a.b=value`` sets a key; a number indexes a list that exists (``recipe.0.optim.epochs=2``)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{path}: --set expects dotted.key=value, got {item!r}")
    *parents, leaf = key.strip().split(".")
    node = raw
    for part in parents:
        if isinstance(node, list):
            node = _list_item(node, part, key, path)
            continue
        child = node.setdefault(part, {})
        if not isinstance(child, (dict, list)):
            raise ConfigError(f"{path}: --set {key}: {part!r} is a value, not a section")
        node = child
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        parsed = value
    if isinstance(node, list):
        index = int(leaf) if leaf.isdigit() else None
        _list_item(node, leaf, key, path)
        node[index] = parsed
    else:
        node[leaf] = parsed


def _list_item(items: list, part: str, key: str, path: Path):
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(f"{path}: --set {key}: {part!r} is not an index of a list of {len(items)}")
    return items[int(part)]


def _describe(err: ValidationError, raw: dict) -> list[str]:
    lines = []
    for error in err.errors():
        field = ".".join(_field_path(error["loc"], raw))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "union_tag_invalid":
            message = f"unknown name {error['ctx']['tag']!r}; choose one of {error['ctx']['expected_tags']}"
            field = f"{field}.{error['ctx']['discriminator'].strip(chr(39))}"
        elif error["type"] == "union_tag_not_found":
            message = "missing"
            field = f"{field}.{error['ctx']['discriminator'].strip(chr(39))}"
        elif error["type"] not in ("missing",) and not isinstance(error.get("input"), (dict, list)):
            message += f" (got {error['input']!r})"
        lines.append(f"{field}: {message}" if field else message)
    return lines


def _field_path(loc: tuple, raw: Any) -> list[str]:
    """The user's dotted path: drops the tag that pydantic inserts for discriminated unions."""
    parts, node = [], raw
    for item in loc:
        if isinstance(node, dict) and item not in node and item in node.values():
            continue  # pydantic's union tag (the value of its discriminator), not a key the user wrote
        parts.append(str(item))
        node = node.get(item) if isinstance(node, dict) else None
    return parts
