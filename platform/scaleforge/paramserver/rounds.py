"""Synchronous SGD's rounds on one shard, with backup workers (Chen et al. 2016, "Revisiting
Distributed Synchronous SGD"). Pure bookkeeping, no Ray: the shard actor holds one and calls it
under its lock.

Round ``r`` collects the gradients computed on version ``r`` of the shard's parameters. With ``b``
backup workers it is complete once all but ``b`` of the active workers have given theirs, and its
update is the mean of the gradients it collected; a straggler then never holds a round up. A
gradient computed on an older version arrives after its round was applied: it is dropped and
counted, never applied late. With ``b = 0`` every round waits for every active worker: plain
synchronous SGD.

A gradient computed on a *newer* version than the shard's can only come from before a restart
(the shard restored an older checkpoint): it joins the current round.

``SyncRounds`` is the shard rule of the ``Sync`` policy (``consistency.py``): ``may_read``, ``admit``,
``update`` and ``leave`` are what a shard asks every mode.
"""

from typing import Iterable, Optional

import numpy as np


class SyncRounds:
    def __init__(self, backup_workers: int = 0):
        self.backup_workers = backup_workers
        self.pending: dict[int, np.ndarray] = {}
        """The current round's gradients, by worker."""
        self.dropped: dict[int, int] = {}
        """Gradients that arrived after their round was applied, by worker."""

    def offer(self, worker: int, grad: np.ndarray, read_version: int, version: int) -> bool:
        """Add ``worker``'s gradient, computed on ``read_version``, to the round of ``version``;
        returns False (and counts it) if that round is over."""
        if read_version < version:
            self.dropped[worker] = self.dropped.get(worker, 0) + 1
            return False
        self.pending[worker] = grad
        return True

    def waiting(self, worker: int) -> bool:
        """Whether ``worker`` has given to the current round (its next read must wait for the update)."""
        return worker in self.pending

    def complete(self, active: Iterable[int]) -> bool:
        """Whether enough of the ``active`` workers have given (all but the backup workers; at least one)."""
        active = set(active)
        given = sum(1 for w in self.pending if w in active)
        return given > 0 and given >= max(1, len(active) - self.backup_workers)

    def take(self) -> np.ndarray:
        """The round's update (the mean of its gradients); the next round starts empty."""
        grad = np.mean(list(self.pending.values()), axis=0)
        self.pending = {}
        return grad

    def forget(self, worker: int) -> None:
        """``worker`` left: its gradient, if it gave one, is not part of the round."""
        self.pending.pop(worker, None)

    def may_read(self, worker: int, clock: int, slowest: int) -> bool:
        """A worker that gave to this round reads the round's update."""
        return not self.waiting(worker)

    def admit(self, worker: int, grad: np.ndarray, read_version: int, version: int) -> bool:
        return self.offer(worker, grad, read_version, version)

    def update(self, grad: np.ndarray, active: Iterable[int]) -> Optional[np.ndarray]:
        """The round's mean once it is complete (``grad`` is in it already), else ``None``."""
        return self.take() if self.complete(active) else None

    def leave(self, worker: int, active: Iterable[int]) -> Optional[np.ndarray]:
        """``worker`` left: the round no longer waits for it, and may be complete now."""
        self.forget(worker)
        return self.take() if self.complete(active) else None
