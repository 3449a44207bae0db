"""A parameter-server worker: a model replica and a data shard; pull, compute, push, repeat."""

import os
import signal
import time
from functools import partial
from typing import Iterator, Optional

import numpy as np
import ray
import torch
import torch.nn.functional as F

from scaleforge.models import MODEL_SPEC, build_model
from scaleforge.paramserver.layout import ParamLayout
from scaleforge.paramserver.outbox import Outbox
from scaleforge.paramserver.specs import ReplicaSpec
from scaleforge.paramserver.window import SharedSlice, WindowReader
from scaleforge.quickfit import as_inputs


def batches(
    x: np.ndarray, y: np.ndarray, batch_size: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless shuffled mini-batches, a fresh permutation per pass (seeded: reproducible)."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch_size):
            rows = order[start : start + batch_size]
            yield as_inputs(x[rows]), torch.as_tensor(y[rows], dtype=torch.int64)


class StepDelays:
    """Simulated stragglers: the seconds a worker sleeps after each step's gradient.

    ``persistent_s`` every step (a worker that is always slower); ``transient_s`` with probability
    ``probability`` at each step, drawn independently per worker and step from ``seed`` (Ho et al.
    2013's transient stragglers: each worker is sometimes slow).
    """

    def __init__(
        self, persistent_s: float = 0.0, transient_s: float = 0.0, probability: float = 0.0, seed: int = 0
    ):
        self.persistent_s, self.transient_s, self.probability = persistent_s, transient_s, probability
        self.rng = np.random.default_rng([seed, 0x5EED])

    def next(self) -> float:
        transient = self.transient_s if self.probability and self.rng.random() < self.probability else 0.0
        return self.persistent_s + transient


class WeightPredictor:
    """Gradients at the parameters a worker's push will meet, not the ones it read: weight prediction
    (SpecTrain, Chen et al. 2018; DANA, Hakimi et al. 2019). Asynchronous updates land ``tau`` updates
    after the read they were computed on; each shard's read is moved on by ``tau`` times its change per
    update since this worker's previous read (an optimiser with momentum keeps going where it went),
    ``tau`` a running mean of the staleness this worker's pushes met on that shard."""

    SMOOTHING = 0.1
    """Weight of the latest push in the running mean of the staleness."""

    def __init__(self, ranges: list[tuple[int, int]]):
        self.ranges = ranges
        self.previous: Optional[np.ndarray] = None
        self.versions = [0] * len(ranges)
        self.staleness = [0.0] * len(ranges)

    def predict(self, flat: np.ndarray, reads: list[tuple[int, int]]) -> None:
        """Move ``flat``, which holds the parameters just read (per shard, ``reads``' versions), to the
        predicted ones in place."""
        read = flat.copy()
        for i, ((start, stop), (version, _)) in enumerate(zip(self.ranges, reads)):
            moved = version - self.versions[i]  # updates since the previous read (< 0: a restarted shard)
            if self.previous is not None and moved > 0 and self.staleness[i]:
                flat[start:stop] += (self.staleness[i] / moved) * (
                    read[start:stop] - self.previous[start:stop]
                )
        self.previous, self.versions = read, [version for version, _ in reads]

    def landed(self, reads: list[tuple[int, int]], acks: list[tuple[int, int]]) -> None:
        """Count the staleness each push met: the updates applied between its read and it."""
        for i, ((read_version, _), (version, _)) in enumerate(zip(reads, acks)):
            if version > read_version:
                self.staleness[i] += self.SMOOTHING * (version - 1 - read_version - self.staleness[i])


def gradient(
    model: torch.nn.Module,
    layout: ParamLayout,
    x: torch.Tensor,
    y: torch.Tensor,
    out: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, float]:
    """The flat gradient of the mean cross-entropy on one batch (a language model's: over every next
    token) written into ``out`` when given, and the loss."""
    model.zero_grad(set_to_none=False)
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, -2), y.flatten())
    loss.backward()
    return layout.flatten(model, grads=True, out=out), loss.item()


@ray.remote
class AsyncWorker:
    """A model replica and a data shard (``spec``): pull, compute, push, repeat."""

    def __init__(self, spec: ReplicaSpec):
        torch.set_num_threads(1)
        self.index, self.shards, self.ranges = spec.index, list(spec.shards), list(spec.ranges)
        self.delays = StepDelays(
            spec.delay_s, spec.transient_delay_s, spec.transient_delay_probability, spec.seed
        )
        self.die_at_step = spec.die_at_step
        # Sync with backup workers: a worker whose gradients were dropped has taken fewer steps than
        # there were rounds; the run is ``steps`` rounds, so it stops once it reads the last version.
        self.rounds_bound = spec.consistency.in_rounds
        # Highest version each shard acknowledged, per shard incarnation: what a shard restart lost.
        self.acked: dict[int, dict[int, int]] = {i: {} for i in range(len(self.shards))}
        self.model = build_model(MODEL_SPEC.validate_python(spec.model), spec.input_dim, spec.num_classes)
        self.layout = ParamLayout.of(self.model)
        self.flat = self.layout.bind(self.model)  # the model's parameters, one vector: a pull is one copy
        self.batches = batches(spec.x, spec.y, spec.batch_size, spec.seed)
        self.outbox = Outbox(self.index, self.shards, self.ranges, spec.run_token)
        self.windows = WindowReader()
        self.predictor = WeightPredictor(self.ranges) if spec.weight_prediction else None

    def ready(self) -> bool:
        """True once constructed (model built, data shard held): a run's clock starts when every worker is."""
        return True

    def run(self, steps: int, first_clock: int = 0) -> dict:
        """``steps`` rounds of pull -> gradient -> push to every shard, never waiting for other
        workers except where the consistency mode makes ``pull`` wait."""
        losses, started, end = [], time.perf_counter(), first_clock + steps
        pulls: list = []
        for clock in range(first_clock, end):
            if clock == self.die_at_step:  # injected fault: the whole process dies
                os.kill(os.getpid(), signal.SIGKILL)
            reads = self._read(pulls or self._request(clock))
            if self.rounds_bound and min(version for version, _ in reads) >= end:
                steps = clock - first_clock
                break
            if self.predictor is not None:
                self.predictor.predict(self.flat, reads)
            _, loss = gradient(self.model, self.layout, *next(self.batches), out=self.outbox.buffer)
            delay = self.delays.next()
            if delay:  # simulated straggler
                time.sleep(delay)
            pulls = []
            # The next step's pull travels beside this push, one round trip a step rather than two, once
            # the worker knows each shard's incarnation: the shard answers it after the push has landed
            # (Ray may run an async actor's calls in any order).
            overlap = clock + 1 < end and None not in self.outbox.incarnations
            send_next = partial(self._request_into, pulls, clock + 1) if overlap else None
            acks = self.outbox.push(reads, clock, meanwhile=send_next)
            if self.predictor is not None:
                self.predictor.landed(reads, acks)
            for shard_index, (version, incarnation) in enumerate(acks):
                seen = self.acked[shard_index]
                seen[incarnation] = max(seen.get(incarnation, 0), version)
            losses.append(loss)
        return {
            "worker": self.index,
            "steps": steps,
            "seconds": time.perf_counter() - started,
            "final_loss": float(np.mean(losses[-10:] or [np.nan])),
            "acked": self.acked,
        }

    def _request(self, clock: int, after_push: bool = False) -> list:
        """Ask every shard for its parameters for step ``clock`` (references to the answers); with
        ``after_push``, the push of step ``clock - 1`` is on its way to each."""
        return [
            shard.pull.remote(self.index, clock, self.outbox.node_id, incarnation if after_push else None)
            for shard, incarnation in zip(self.shards, self.outbox.incarnations)
        ]

    def _request_into(self, pulls: list, clock: int) -> None:
        """The pulls of step ``clock``, sent beside the push of step ``clock - 1``, into ``pulls``."""
        pulls.extend(self._request(clock, after_push=True))

    def _read(self, pulls: list) -> list[tuple[int, int]]:
        """Every shard's parameters into the model; per shard, the (version, slowest clock) read."""
        reads = []
        for (start, stop), (values, version, slowest) in zip(self.ranges, ray.get(pulls)):
            if isinstance(values, SharedSlice):  # a shard on this node: straight from its shared memory
                version = self.windows.copy(values, self.flat[start:stop])
            else:
                self.flat[start:stop] = values
            reads.append((version, slowest))
        return reads

    def close(self) -> None:
        """Delete this worker's shared gradient buffer."""
        self.outbox.close()
