"""The consistency modes of the parameter server as policy objects: when a worker may read a shard,
which of its gradients a shard applies, and when.

- ``Async``: every gradient is applied as it arrives (Hogwild / Downpour).
- ``SSP``: asynchronous, but a worker more than ``bound`` steps ahead of the slowest waits to read
  (stale synchronous parallel, Ho et al. 2013).
- ``Sync``: rounds of one gradient from every worker, averaged; with ``backup_workers`` a round
  needs all but that many (Chen et al. 2016). The rounds are ``SyncRounds``' (``rounds.py``).

A policy is a frozen description that travels to every shard and worker in their specs. A shard
asks ``for_shard()`` for the rule it applies: the policy itself where the mode keeps no state,
a shard's own ``SyncRounds`` for sync. Adding a mode is a class here, its entry in ``POLICIES`` and
its name in the config's ``server.mode``; nothing else compares mode names.
"""

from dataclasses import dataclass
from typing import ClassVar, Iterable, Optional, Protocol, Union

import numpy as np

from scaleforge.paramserver.rounds import SyncRounds


class ShardRule(Protocol):
    """What a shard asks its consistency mode, under its lock."""

    dropped: dict[int, int]
    """Gradients that arrived too late to be applied, by worker."""

    def may_read(self, worker: int, clock: int, slowest: int) -> bool:
        """Whether ``worker`` may read the parameters for its step ``clock`` now (``slowest``: the
        slowest active worker's clock); a pull waits until it may."""

    def admit(self, worker: int, grad: np.ndarray, read_version: int, version: int) -> bool:
        """Take ``worker``'s gradient, computed on ``read_version`` (the shard is at ``version``);
        False drops it as late."""

    def update(self, grad: np.ndarray, active: Iterable[int]) -> Optional[np.ndarray]:
        """The update to apply now that ``grad`` was admitted, or ``None`` to wait for more."""

    def leave(self, worker: int, active: Iterable[int]) -> Optional[np.ndarray]:
        """``worker`` left (``active``: those that remain); an update that no longer waits for it."""


@dataclass(frozen=True)
class Async:
    """Apply every gradient as it arrives."""

    name: ClassVar[str] = "async"
    in_rounds: ClassVar[bool] = False
    """Whether updates come in rounds, one per step of the run (a worker then stops once it reads the
    last round's parameters, even where some of its gradients were dropped)."""
    takes_backup_workers: ClassVar[bool] = False
    """Whether ``server.backup_workers`` applies."""
    predicts_weights: ClassVar[bool] = True
    """Whether ``workers.weight_prediction`` applies: a gradient may land on parameters that other
    updates moved after it read them."""

    @classmethod
    def of(cls, server) -> "Async":
        """The policy that the ``server`` section of a config (``ServerSpec``) asks for."""
        return cls()

    @property
    def dropped(self) -> dict[int, int]:
        return {}

    def for_shard(self) -> ShardRule:
        return self

    def gradients_per_update(self, num_workers: int) -> int:
        """Workers' gradients that one update of a shard applies."""
        return 1

    def may_read(self, worker: int, clock: int, slowest: int) -> bool:
        return True

    def admit(self, worker: int, grad: np.ndarray, read_version: int, version: int) -> bool:
        return True

    def update(self, grad: np.ndarray, active: Iterable[int]) -> Optional[np.ndarray]:
        return grad

    def leave(self, worker: int, active: Iterable[int]) -> Optional[np.ndarray]:
        return None


@dataclass(frozen=True)
class SSP(Async):
    """Asynchronous, within a bound: a worker more than ``bound`` steps ahead of the slowest waits."""

    name: ClassVar[str] = "ssp"
    bound: int = 2
    """SSP's s (``server.staleness_bound``)."""

    @classmethod
    def of(cls, server) -> "SSP":
        return cls(server.staleness_bound)

    def may_read(self, worker: int, clock: int, slowest: int) -> bool:
        return clock - slowest <= self.bound


@dataclass(frozen=True)
class Sync:
    """Rounds: each shard applies the mean of one gradient per worker (all but ``backup_workers``)."""

    name: ClassVar[str] = "sync"
    in_rounds: ClassVar[bool] = True
    takes_backup_workers: ClassVar[bool] = True
    predicts_weights: ClassVar[bool] = False  # a round's gradients are computed on what they update
    backup_workers: int = 0

    @classmethod
    def of(cls, server) -> "Sync":
        return cls(server.backup_workers)

    def for_shard(self) -> ShardRule:
        return SyncRounds(self.backup_workers)

    def gradients_per_update(self, num_workers: int) -> int:
        return num_workers - self.backup_workers


Policy = Union[Async, SSP, Sync]

POLICIES: dict[str, type] = {policy.name: policy for policy in (Sync, Async, SSP)}
"""Every consistency mode by its ``server.mode`` name."""


def consistency_of(server) -> Policy:
    """The policy of a config's ``server`` section (``ServerSpec``): its mode with its parameters."""
    return POLICIES[server.mode].of(server)


def modes_where(capability: str) -> str:
    """The modes with a capability (``"takes_backup_workers"``), as an error message names them:
    ``async or ssp``."""
    return " or ".join(sorted(name for name, policy in POLICIES.items() if getattr(policy, capability)))
