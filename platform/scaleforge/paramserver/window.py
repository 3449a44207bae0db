"""How a shard's parameters reach the workers on its node: read straight from shared memory.

The other half of ``outbox``. Written by hand for the same reason: through Ray's object store a
pull costs a copy out of the optimiser's tensor, a fresh object and its page faults, and a copy
into the model. Here a shard keeps its parameters in a file on the node's tmpfs (``/dev/shm``)
and the optimiser updates them there in place; a pull on the same node returns a small
``SharedSlice`` note, and the worker copies the slice straight into its model (one pass).

Readers never block the shard. Each update is bracketed by a sequence counter in the file's
header (a seqlock): odd while the parameters change, even when they are whole. A reader copies,
then checks that the counter was even and unchanged; otherwise it copies again. The header also
holds the version of the parameters, so a worker learns which version it actually read.
"""

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from scaleforge.paramserver.outbox import shm_file, shm_has_room

HEADER = 2
"""int64 words before the parameters: the sequence counter, the version."""


@dataclass(frozen=True)
class SharedSlice:
    """Where a shard keeps its parameters: ``path`` on node ``node_id`` (the reader knows their number)."""

    path: str
    node_id: str


def window_path(run_token: str, shard: int) -> Path:
    return shm_file(run_token, f"shard{shard}")


class ParamWindow:
    """A shard's parameters in shared memory (``values``), published to readers on its node.

    Args:
        path: the file; a restarted shard reopens its predecessor's file, which workers still map.
        size: float32 values.
        node_id: the node this shard runs on.
    """

    def __init__(self, path: Path, size: int, node_id: str):
        reuse = path.is_file() and path.stat().st_size == 8 * HEADER + 4 * size
        self._map = np.memmap(
            path, dtype=np.uint8, mode="r+" if reuse else "w+", shape=(8 * HEADER + 4 * size,)
        )
        self.header = self._map[: 8 * HEADER].view(np.int64)
        self.values = self._map[8 * HEADER :].view(np.float32)
        self.note = SharedSlice(str(path), node_id)

    @classmethod
    def create(cls, run_token: Optional[str], shard: int, size: int, node_id: str) -> "Optional[ParamWindow]":
        """A window, or ``None`` (no run token, no tmpfs, or too little room on it: a full tmpfs would
        SIGBUS)."""
        if not run_token or not shm_has_room(4 * size):
            return None
        return cls(window_path(run_token, shard), size, node_id)

    @contextmanager
    def writing(self, version_after):
        """Bracket a change of ``values``; readers retry a copy that overlapped it. ``version_after``
        is called once the change is done: the version the parameters now have."""
        self.header[0] += 1  # odd: changing
        try:
            yield
        finally:
            self.header[1] = version_after()
            self.header[0] += 1  # even: whole

    def close(self) -> None:
        Path(self.note.path).unlink(missing_ok=True)


class WindowReader:
    """A worker's view of the shards' windows on its node."""

    def __init__(self):
        self.maps: dict[str, np.memmap] = {}

    def copy(self, note: SharedSlice, out: np.ndarray) -> int:
        """Copy the noted parameters into ``out``, whole (never half of one update); returns their version."""
        if note.path not in self.maps:
            self.maps[note.path] = np.memmap(note.path, dtype=np.uint8, mode="r")
        raw = self.maps[note.path]
        header, values = raw[: 8 * HEADER].view(np.int64), raw[8 * HEADER :].view(np.float32)
        while True:
            before = int(header[0])
            if before % 2 == 0:
                np.copyto(out, values)
                version = int(header[1])
                if int(header[0]) == before:
                    return version
            time.sleep(0)  # an update is under way: let the shard finish it
