"""Reading and writing whole files at a local path or a URI; writes are all-or-nothing."""

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Union

import pyarrow.fs as pafs

from scaleforge.storage.locations import StorageError, _first_line, describe, is_uri, local_path, resolve
from scaleforge.storage.types import Location

_CHUNK = 1 << 20


def node_cache() -> Path:
    """This node's cache folder: ``$SCALEFORGE_CACHE``, else ``~/.cache/scaleforge``."""
    return Path(os.environ.get("SCALEFORGE_CACHE") or "~/.cache/scaleforge").expanduser().resolve()


def write_atomic(location: Location, data: Union[str, bytes, Callable[[BinaryIO], None]]) -> Union[Path, str]:
    """Replace the file at ``location`` with ``data`` in one step; a local parent folder is created.

    Args:
        location: The file to write: a local path or a URI.
        data: Text (UTF-8), bytes, or a function that writes into the open binary file
            (``np.savez``, ``safetensors``' ``save`` ...).

    Returns:
        A local ``location`` as a :class:`~pathlib.Path`, a URI as given.
    """
    if _in_object_store(location):
        with tempfile.TemporaryFile() as spool:
            data(spool) if callable(data) else spool.write(data.encode() if isinstance(data, str) else data)
            spool.seek(0)
            _upload(spool, location)
        return str(location)
    path = _local_file(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            if callable(data):
                data(handle)
            else:
                handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    return str(location) if is_uri(location) else path


def upload(local: Location, location: Location) -> None:
    """Copy the local file ``local`` to ``location`` (whole or not at all, as :func:`write_atomic`)."""
    with open(local, "rb") as source:
        if _in_object_store(location):
            _upload(source, location)
        else:
            write_atomic(location, lambda out: shutil.copyfileobj(source, out, _CHUNK))


def _in_object_store(location: Location) -> bool:
    """Whether ``location`` is a URI other than ``file://`` (whose writes are staged and renamed)."""
    return is_uri(location) and not str(location).startswith("file://")


def _local_file(location: Location) -> Path:
    """A local path, or a ``file://`` URI's path, as a :class:`~pathlib.Path`."""
    return Path(resolve(location)[1]) if is_uri(location) else local_path(location)


def _upload(source: BinaryIO, location: Location) -> None:
    filesystem, path = resolve(location)
    with filesystem.open_output_stream(path) as out:
        for chunk in iter(lambda: source.read(_CHUNK), b""):
            out.write(chunk)


def download(location: Location, handle: BinaryIO) -> None:
    """Stream the file at ``location`` into the open binary ``handle``."""
    filesystem, path = resolve(location)
    with filesystem.open_input_stream(path) as source:
        for chunk in iter(lambda: source.read(_CHUNK), b""):
            handle.write(chunk)


def read_bytes(location: Location) -> bytes:
    """The whole file at ``location``."""
    if not is_uri(location):
        return local_path(location).read_bytes()
    filesystem, path = resolve(location)
    with filesystem.open_input_stream(path) as source:
        return source.read()


def read_text(location: Location) -> str:
    """The whole file at ``location``, decoded as UTF-8."""
    return read_bytes(location).decode()


def is_file(location: Location) -> bool:
    """Whether ``location`` is an existing file (an object, on an object store)."""
    return _info(location).type == pafs.FileType.File


def is_dir(location: Location) -> bool:
    """Whether ``location`` is an existing folder (a prefix with objects under it, on an object store)."""
    return _info(location).type == pafs.FileType.Directory


def delete_file(location: Location) -> None:
    """Remove the file at ``location`` if it exists."""
    if is_file(location):
        filesystem, path = resolve(location)
        filesystem.delete_file(path)


def sha256_file(path: Location) -> str:
    """The hex sha256 of a local file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _info(location: Location) -> pafs.FileInfo:
    filesystem, path = resolve(location)
    try:
        return filesystem.get_file_info(path)
    except OSError as err:
        raise StorageError(f"{describe(location)}: {_first_line(err)}") from None


def file_sizes(location: Location) -> dict[str, int]:
    """Name -> bytes of each file directly in the folder (under the prefix, for a URI) at ``location``."""
    filesystem, path = resolve(location)
    found = filesystem.get_file_info(pafs.FileSelector(path, recursive=False))
    return {info.base_name: info.size for info in found if info.type == pafs.FileType.File}
