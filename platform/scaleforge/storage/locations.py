"""Naming storage: local paths and URIs, the ``pyarrow`` filesystem behind each, and reachability checks."""

import functools
import re
from pathlib import Path
from typing import Optional

import pyarrow
import pyarrow.fs as pafs

from scaleforge.storage.types import Location

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class StorageError(RuntimeError):
    """A location cannot be opened: an unknown scheme, an unreachable endpoint, a missing bucket."""


def is_uri(location: Location) -> bool:
    """Whether ``location`` is a URI (``scheme://...``) rather than a local path."""
    return bool(_SCHEME.match(str(location)))


def local_path(location: Location) -> Path:
    """A local path, ``~`` expanded and made absolute; a URI is refused (never taken as a folder name)."""
    if is_uri(location):
        raise StorageError(f"{location}: a URI where a local path is needed")
    return Path(location).expanduser().resolve()


def normalize(location: Location) -> str:
    """A URI unchanged, a local path absolute with ``~`` expanded: the form records and manifests keep."""
    return str(location) if is_uri(location) else str(local_path(location))


def join(location: Location, *names: str) -> str:
    """``location/name/...``; for a URI the names go before its query (``?endpoint_override=...``)."""
    if not is_uri(location):
        return str(local_path(location).joinpath(*names))
    base, sep, query = str(location).partition("?")
    return "/".join([base.rstrip("/"), *names]) + sep + query


def with_suffix(location: Location, suffix: str) -> str:
    """``location`` with ``suffix`` appended to its last segment (``.../moe`` -> ``.../moe-gate``)."""
    if not is_uri(location):
        return f"{local_path(location)}{suffix}"
    base, sep, query = str(location).partition("?")
    return base.rstrip("/") + suffix + sep + query


def resolve(location: Location) -> tuple[pafs.FileSystem, str]:
    """The ``pyarrow`` filesystem and the path inside it for a URI or a local path.

    Filesystems are made once per scheme, authority and query (an S3 client per endpoint).
    """
    if not is_uri(location):
        return pafs.LocalFileSystem(), str(local_path(location))
    base, sep, query = str(location).partition("?")
    scheme, rest = _split(base)
    if scheme == "file":
        return pafs.LocalFileSystem(), rest or "/"
    authority, _, key = rest.partition("/")
    try:
        filesystem = _filesystem(f"{scheme}://{authority}{sep}{query}")
    except StorageError as err:
        raise StorageError(f"{describe(location)}: {err}") from None
    if scheme in _HOST_SCHEMES:  # the authority is a namenode, the path starts at the root
        return filesystem, "/" + key.rstrip("/")
    return filesystem, rest.rstrip("/")  # object stores: bucket/key


_HOST_SCHEMES = ("hdfs", "viewfs")


def _split(base: str) -> tuple[str, str]:
    scheme = _SCHEME.match(base).group(1)
    return scheme, base[len(scheme) + 3 :]


@functools.lru_cache(maxsize=32)
def _filesystem(root: str) -> pafs.FileSystem:
    scheme = _SCHEME.match(root).group(1)
    try:
        return pafs.FileSystem.from_uri(root)[0]
    except (pyarrow.ArrowInvalid, pyarrow.ArrowNotImplementedError, OSError) as err:
        raise StorageError(f"this build cannot open {scheme}:// storage ({_first_line(err)})") from None


def check_reachable(location: Location) -> None:
    """Fail fast, with one line naming the URI, when a URI's endpoint or bucket cannot be reached.

    A local path always passes (its folders are created on first write).

    Raises:
        StorageError: the scheme cannot be opened, the endpoint does not answer, or the bucket
            (the URI's first segment) does not exist.
    """
    if not is_uri(location) or str(location).startswith("file://"):
        return
    filesystem, path = resolve(location)
    bucket = "/" if path.startswith("/") else path.split("/")[0]  # a namenode has no buckets
    try:
        found = filesystem.get_file_info(bucket)
    except OSError as err:
        raise StorageError(f"{describe(location)}: storage not reachable ({_first_line(err)})") from None
    if found.type == pafs.FileType.NotFound:
        raise StorageError(f"{describe(location)}: bucket {bucket!r} does not exist")


def check_fields(locations: dict[str, Optional[Location]]) -> None:
    """:func:`check_reachable` for each config field that names a location; the error names the field."""
    for field, location in locations.items():
        try:
            if location:
                check_reachable(location)
        except StorageError as err:
            raise StorageError(f"{field}: {err}") from None


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def describe(location: Location) -> str:
    """``location`` for messages: a URI without its query or any ``user:secret@`` it carries."""
    if not is_uri(location):
        return str(location)
    scheme, rest = _split(str(location).partition("?")[0])
    authority, slash, key = rest.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{key}"
