"""Writing files so that a reader never sees half of one.

Every file that a job writes for another process to read (records, configs, caches, checkpoints)
goes through :func:`write_atomic`: the bytes land in a temporary file in the same folder, which
is then renamed over the target (``os.replace`` is atomic on POSIX), so a crash leaves either
the old file or the new one.
"""

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Union


def write_atomic(path: Union[str, os.PathLike], data: Union[str, bytes, Callable[[BinaryIO], None]]) -> Path:
    """Replace ``path`` with ``data`` in one step; the parent folder is created if needed.

    Args:
        path: The file to write.
        data: Text (UTF-8), bytes, or a function that writes into the open binary file
            (``np.savez``, ``safetensors``' ``save`` ...).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
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
    return path
