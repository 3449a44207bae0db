"""How a worker's gradient reaches the shards: in place through shared memory on its own node,
through Ray's object store to any other node.

Written by hand because Ray's object store copies every task argument into a fresh object (one
more pass over each gradient, plus an allocation and a reference count per push), and its
mutable shared-memory channels (``ray.experimental.channel``) are experimental and tied to
compiled graphs. Here each worker owns one buffer the size of the flat gradient, a file on the
node's tmpfs (``/dev/shm``). It writes every new gradient straight into it; a shard on the same
node maps the file once and applies its slice in place, so a push carries only a small
``SharedGradient`` note. The worker writes again only after every shard has acknowledged, so a
shard never reads a half-written gradient; a push that Ray retries on a restarted shard finds the
same bytes. A shard on another node (or one restarted there) gets its slice through the object
store, as before.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import ray

SHM_DIR = Path("/dev/shm")
RESEND = "resend"
"""A shard's answer to a ``SharedGradient`` it cannot read (it runs on another node): send the array."""


@dataclass(frozen=True)
class SharedGradient:
    """Where a worker left its gradient: ``path`` on node ``node_id``; this shard's slice starts at
    ``start``."""

    path: str
    node_id: str
    start: int


def shm_file(run_token: str, owner: str) -> Path:
    """The tmpfs file of one actor of a run (``worker3``, ``shard0``): every name the run uses starts
    with its token, so that ``remove_buffers`` finds them all."""
    return SHM_DIR / f"scaleforge-{run_token}-{owner}"


def buffer_path(run_token: str, worker: int) -> Path:
    return shm_file(run_token, f"worker{worker}")


def remove_buffers(run_token: str) -> None:
    """Delete this node's shared buffers of a run, gradients and parameters (the driver does this
    when the run ends)."""
    for path in SHM_DIR.glob(f"scaleforge-{run_token}-*"):
        path.unlink(missing_ok=True)


class Outbox:
    """One worker's gradient buffer and its way to every shard.

    Args:
        worker: the worker's index.
        shards: the shard actors, in order.
        ranges: each shard's [start, stop) in the flat vector.
        run_token: names the shared buffer; ``None`` keeps it in private memory (object store only).
    """

    def __init__(self, worker: int, shards: list, ranges: list[tuple[int, int]], run_token: Optional[str]):
        self.worker, self.shards, self.ranges = worker, shards, ranges
        self.node_id = ray.get_runtime_context().get_node_id()
        total = ranges[-1][1]
        path = buffer_path(run_token, worker) if run_token else None
        if path and shm_has_room(4 * total):
            # A replacement worker reopens its predecessor's buffer rather than truncating a file
            # that shards still map.
            reuse = path.is_file() and path.stat().st_size == 4 * total
            self.path = str(path)
            self.buffer = np.memmap(path, dtype=np.float32, mode="r+" if reuse else "w+", shape=(total,))
        else:
            self.path, self.buffer = None, np.empty(total, dtype=np.float32)
        self.incarnations = [None] * len(shards)
        self.local = [False] * len(shards)
        self._locate(range(len(shards)))

    def push(
        self, reads: list[tuple[int, int]], clock: int, meanwhile: Optional[Callable[[], None]] = None
    ) -> list[tuple[int, int]]:
        """Send the gradient in ``buffer`` (computed for step ``clock``) to every shard.

        Args:
            reads: per shard, the (version, slowest clock) its parameters had when they were read.
            meanwhile: called once every push is on its way, before waiting for the acknowledgements
                (a worker sends its next pull there: two round trips overlap).

        Returns:
            Per shard, the (version, incarnation) that acknowledged the push.
        """
        refs = [self._send(i, read, clock) for i, read in enumerate(reads)]
        if meanwhile is not None:
            meanwhile()
        acks = ray.get(refs)
        for i, ack in enumerate(acks):
            if ack == RESEND:  # restarted on another node: the bytes are still in our buffer
                self.local[i] = False
                acks[i] = ray.get(self._send(i, reads[i], clock))
        moved = [i for i, (_, incarnation) in enumerate(acks) if incarnation != self.incarnations[i]]
        if moved:  # a restarted shard may run on another node now
            self._locate(moved)
            for i in moved:
                self.incarnations[i] = acks[i][1]
        return acks

    def close(self) -> None:
        """Delete the shared buffer (a worker's last act)."""
        if self.path:
            Path(self.path).unlink(missing_ok=True)

    def _send(self, i: int, read: tuple[int, int], clock: int):
        a, b = self.ranges[i]
        grad = SharedGradient(self.path, self.node_id, a) if self.local[i] else self.buffer[a:b]
        return self.shards[i].push.remote(self.worker, grad, read[0], read[1], clock)

    def _locate(self, indices) -> None:
        nodes = ray.get([self.shards[i].node_id.remote() for i in indices])
        for i, node in zip(indices, nodes):
            self.local[i] = self.path is not None and node == self.node_id


class Inbox:
    """A shard's view of the gradients that workers on its node left in shared memory."""

    def __init__(self, size: int):
        self.size, self.node_id = size, ray.get_runtime_context().get_node_id()
        self.maps: dict[str, np.memmap] = {}

    def read(self, note: SharedGradient) -> Optional[np.ndarray]:
        """This shard's slice of the noted gradient, in place; ``None`` if it is not on this node."""
        if note.node_id != self.node_id:
            return None
        if note.path not in self.maps:
            self.maps[note.path] = np.memmap(note.path, dtype=np.float32, mode="r")
        return self.maps[note.path][note.start : note.start + self.size]


def shm_has_room(nbytes: int) -> bool:
    """Whether this node's tmpfs exists and has twice ``nbytes`` free (a full tmpfs would SIGBUS a writer)."""
    if not SHM_DIR.is_dir():
        return False
    stats = os.statvfs(SHM_DIR)
    return stats.f_bavail * stats.f_frsize > 2 * nbytes
