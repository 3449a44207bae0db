"""A parameter-server shard: one contiguous slice of the model, its optimiser state and version.

Written by hand on Ray actors because no library offers a parameter server on Ray. The shard
is an async actor: ``pull`` may wait (the sync barrier, the SSP bound) without blocking the
pushes that release it.

Two staleness measures are recorded for every gradient:
- ``clock``: the pushing worker's clock (its step count) minus the slowest worker's clock when
  the parameters were read: how far it ran ahead. SSP bounds it by ``s``; sync keeps it 0.
- ``updates``: updates applied to this shard between the read and this push (Zhang et al.
  2016's staleness, used by the staleness-aware learning rate).

How a shard orders reads and updates is its consistency mode's (``consistency.py``): the shard
asks its rule whether a pull may read, whether a gradient is admitted and which update to apply.
"""

import asyncio
import os
import signal
import warnings
from contextlib import nullcontext
from typing import Optional

import numpy as np
import ray
import torch

from scaleforge.paramserver.checkpoint import ShardState, load_checkpoint, save_checkpoint
from scaleforge.paramserver.layout import InitialSlice
from scaleforge.paramserver.outbox import RESEND, Inbox, SharedGradient
from scaleforge.paramserver.specs import ShardSpec
from scaleforge.paramserver.update import SliceOptimizer
from scaleforge.paramserver.window import ParamWindow
from scaleforge.storage import join


@ray.remote
class ParameterShard:
    """Shard ``index`` of a run: ``init`` (its initial slice, or a description to rebuild it from) under
    ``spec``'s mode and optimiser. ``die_at_update``: an injected fault, the process SIGKILLs itself
    at this version."""

    def __init__(
        self,
        index: int,
        init: "np.ndarray | InitialSlice",
        spec: ShardSpec,
        die_at_update: Optional[int] = None,
    ):
        self.index = index
        # Ray re-runs __init__ when it restarts this actor (max_restarts): then restore, never die again.
        with warnings.catch_warnings():  # Ray's own property reads its deprecated ``actor_id``
            warnings.simplefilter("ignore", DeprecationWarning)
            self.incarnation = int(ray.get_runtime_context().was_current_actor_reconstructed)
        self.die_at_update = die_at_update if self.incarnation == 0 else None
        if isinstance(init, InitialSlice):
            init = init.values()
        self.inbox = Inbox(len(init))  # gradients that workers on this node leave in shared memory
        # The parameters live in shared memory where they can: workers on this node read them there.
        self.window = ParamWindow.create(spec.run_token, index, len(init), self.inbox.node_id)
        self.version = 0
        if self.window is None:
            values = np.array(init, dtype=np.float32)
        else:
            values = self.window.values
            with self._writing():
                values[:] = init
        self.param = torch.from_numpy(values)
        self.optimizer = SliceOptimizer(self.param, spec.optimizer, spec.momentum)
        self.lr, self.staleness_aware_lr = spec.lr, spec.staleness_aware_lr
        # Steps received from each active worker; workers join and leave while a run trains.
        self.clocks = {w: 0 for w in range(spec.num_workers)}
        self.rule = spec.consistency.for_shard()  # this shard's own (sync: its rounds)
        self.staleness: dict[str, list[int]] = {"clock": [], "updates": []}
        self.changed = asyncio.Condition()
        checkpoint_dir = spec.checkpoint_dir
        self.checkpoint_path = join(checkpoint_dir, f"shard{index}.safetensors") if checkpoint_dir else None
        self.checkpoint_every = spec.checkpoint_every
        self.rounds = spec.rounds
        self.restored_version = self._restore()

    async def pull(
        self, worker: int, clock: int, node_id: Optional[str] = None, pushed_to: Optional[int] = None
    ):
        """This shard's slice for ``worker``'s step ``clock`` (a worker on ``node_id``); waits while the
        consistency mode says so.

        Args:
            pushed_to: the worker's push of step ``clock - 1`` travels beside this pull, sent to this
                incarnation of the shard. If this is that incarnation, the pull waits for the push to
                land (the worker reads its own update, and its clock counts the step only once its
                gradient is in). Otherwise, as without it, the pull counts the worker's ``clock``
                steps as done: a restarted shard may never see a push its predecessor acknowledged.

        Returns:
            (slice, version, slowest worker's clock) at the time of reading. For a worker on this
            shard's node the slice is a ``SharedSlice`` note: it reads the values (and their
            version) from shared memory itself.
        """
        async with self.changed:
            if pushed_to == self.incarnation:
                await self.changed.wait_for(lambda: self.clocks.get(worker, clock) >= clock)
            elif worker in self.clocks:  # it has completed `clock` steps; after a restore this count may lag
                self.clocks[worker] = max(self.clocks[worker], clock)
            # sync: a worker that gave to this round reads its update; ssp: one s steps ahead waits
            await self.changed.wait_for(lambda: self.rule.may_read(worker, clock, self._slowest()))
            if self.window is not None and node_id == self.window.note.node_id:
                return self.window.note, self.version, self._slowest()
            return self.param.detach().numpy().copy(), self.version, self._slowest()

    async def push(
        self, worker: int, grad: "np.ndarray | SharedGradient", read_version: int, read_clock: int, clock: int
    ) -> "tuple[int, int] | str":
        """Apply (or, in sync mode, collect) ``worker``'s gradient of its step ``clock``, computed on
        ``read_version``: this shard's slice, or a note of where a worker on this node left it.

        Returns:
            (version after this push, incarnation of this shard), so workers can count what a
            restart lost; ``RESEND`` for a note this shard cannot read (it runs on another node).
        """
        if isinstance(grad, SharedGradient):
            grad = self.inbox.read(grad)
            if grad is None:
                return RESEND
        async with self.changed:
            if worker not in self.clocks:  # a removed worker's last push, still in flight
                return self.version, self.incarnation
            self.clocks[worker] = max(self.clocks[worker], clock + 1)
            self.changed.notify_all()  # the worker's next pull may wait for this push to land
            if self.rounds is not None and self.version >= self.rounds:
                return self.version, self.incarnation  # every round of the run is applied
            if not self.rule.admit(worker, grad, read_version, self.version):
                return self.version, self.incarnation  # dropped: its round is over
            self.staleness["clock"].append(clock - read_clock)
            self.staleness["updates"].append(self.version - read_version)
            update = self.rule.update(grad, self.clocks)  # sync: the round's mean once it is complete
            if update is not None:
                self._commit(update, self.version - read_version)
            return self.version, self.incarnation

    async def join(self, worker: int, clock: int) -> None:
        """Dynamic scaling: ``worker`` takes part from step ``clock`` on."""
        async with self.changed:
            self.clocks[worker] = clock
            self.changed.notify_all()

    async def leave(self, worker: int) -> None:
        """Dynamic scaling: ``worker`` stops; a sync round no longer waits for it."""
        async with self.changed:
            self.clocks.pop(worker, None)
            update = self.rule.leave(worker, self.clocks)
            if update is not None:
                self._commit(update, 0)
            self.changed.notify_all()

    def _commit(self, grad: np.ndarray, staleness: int) -> None:
        """Apply one update (sync: the mean of the round's gradients), checkpoint, wake waiters."""
        with self._writing():
            self._apply(grad, staleness)
            self.version += 1
        if self.checkpoint_every and self.version % self.checkpoint_every == 0:
            self._checkpoint()
        if self.version == self.die_at_update:  # injected fault: the whole process dies
            os.kill(os.getpid(), signal.SIGKILL)
        self.changed.notify_all()

    def close(self) -> None:
        """Delete the shared parameters (the run is over)."""
        if self.window is not None:
            self.window.close()

    def snapshot(self):
        """(slice, version) without waiting: for evaluation and export."""
        return self.param.detach().numpy().copy(), self.version

    def stats(self) -> dict:
        return {
            "version": self.version,
            "restored_version": self.restored_version,
            "incarnation": self.incarnation,
            "staleness": self.staleness,
            "dropped": self.rule.dropped,
        }

    def clock_of(self, worker: int) -> int:
        """Steps of ``worker`` this shard has received."""
        return self.clocks[worker]

    def node_id(self) -> str:
        return self.inbox.node_id

    def slowest_clock(self) -> int:
        return self._slowest()

    def _slowest(self) -> int:
        return min(self.clocks.values(), default=0)

    def _writing(self):
        """Around every change of the parameters: readers in shared memory never see half of one."""
        return self.window.writing(lambda: self.version) if self.window is not None else nullcontext()

    def _apply(self, grad: np.ndarray, staleness: int) -> None:
        with warnings.catch_warnings():  # object-store arrays are read-only; the optimiser only reads them
            warnings.simplefilter("ignore", UserWarning)
            grad = torch.from_numpy(np.asarray(grad, dtype=np.float32))
        # Zhang et al. 2016's staleness-aware rate: divide the step by the staleness
        self.optimizer.step(grad, self.lr / max(1, staleness) if self.staleness_aware_lr else self.lr)

    def _checkpoint(self) -> None:
        state = ShardState(self.param, self.optimizer.state, self.version, self.clocks)
        save_checkpoint(self.checkpoint_path, state)

    def _restore(self) -> int:
        """After a restart (never on a fresh start), load the last checkpoint; returns its version."""
        if not (self.incarnation and self.checkpoint_path):
            return 0
        state = load_checkpoint(self.checkpoint_path)
        if state is None:
            return 0
        with self._writing(), torch.no_grad():
            self.param.copy_(state.param)
            self.version = state.version
        self.optimizer.state = state.optimizer
        self.clocks = state.clocks
        return self.version
