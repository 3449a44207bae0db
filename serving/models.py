"""A model artifact served as a deployment: dynamic batching with ``@serve.batch``.

Models are read by :func:`scaleforge.artifacts.servable.load_servable`, the one loader that
serving and calibration share (other artifact kinds plug in there).
"""

import asyncio
import logging

import numpy as np
import ray
import torch
from ray import serve
from ray.serve.handle import DeploymentHandle

from scaleforge.artifacts.servable import load_servable
from scaleforge.config.serve import ModelEntry
from scaleforge.serving_contract import predict, split_like


class _RowBatchesAreNotRequests(logging.Filter):
    """``serve.batch`` warns when ``max_batch_size * max_concurrent_batches`` exceeds the replica's
    ``max_ongoing_requests``, taking all three to count requests. The coalescing batches below count
    rows (``batch_size_fn``): one request may fill a batch, so that warning does not apply to them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is larger than `max_ongoing_requests`" not in record.getMessage()


class CoalescingClient:
    """Calls one model deployment from the ingress, merging this replica's concurrent calls into one.

    Every handle call costs a few milliseconds of CPU whatever its size (routing, serialisation,
    the actor call, the replica's batching), so under load the ingress sends whatever calls are
    waiting as one array and splits the logits back: fewer, larger calls, the same answers. With
    nothing waiting a call goes out at once (no added wait); a merged call holds at most
    ``max_rows`` rows (the largest request the ingress admits, so the model replica's forward
    passes are no larger than without merging), at most ``in_flight`` merged calls are
    outstanding, and the model replica's own ``@serve.batch`` merges across ingress replicas.
    """

    def __init__(self, handle: DeploymentHandle, max_rows: int, in_flight: int = 4):
        logging.getLogger("ray.serve").addFilter(_RowBatchesAreNotRequests())

        @serve.batch(
            max_batch_size=max_rows,
            batch_size_fn=lambda arrays: sum(len(x) for x in arrays),
            batch_wait_timeout_s=0.0,
            max_concurrent_batches=in_flight,
        )
        async def merged(batches: list[np.ndarray]) -> list[np.ndarray]:
            return split_like(batches, await predict(handle, np.concatenate(batches)))

        self.predict = merged


class Forward:
    """A model artifact loaded for inference: logits of one merged batch (what every serving path runs)."""

    def __init__(self, entry: ModelEntry):
        torch.set_num_threads(entry.threads)
        self.model = load_servable(entry.artifact)
        # A replica given a GPU share runs there (Ray sets CUDA_VISIBLE_DEVICES); otherwise on CPU.
        self.device = torch.device("cuda" if entry.num_gpus and torch.cuda.is_available() else "cpu")
        self.model.module.to(self.device)

    def __call__(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        """[rows, input_dim] float32 per request -> [rows, num_classes] float32 logits per request."""
        with torch.inference_mode():
            logits = (
                self.model.module(torch.from_numpy(np.concatenate(batches)).to(self.device)).cpu().numpy()
            )
        return split_like(batches, logits)


class InIngressModel:
    """A model run inside the ingress replica (``in_ingress: true``): the same merged forward pass as
    a :class:`ModelServer`, without the hop. The pass runs on the ingress's event loop, as a plain
    server's would.

    Calls are merged as ``@serve.batch`` merges them (the calls waiting when the pass starts, at most
    ``max_batch_size``, after ``batch_wait_timeout_s``), by a plain future per call: for a model in
    the same process, Serve's batcher (a queue and a task per batch) showed in the ingress's profile
    as a sizeable share of a cascade's stage-0 answer (``bench/serving.py``)."""

    def __init__(self, entry: ModelEntry):
        self.entry = entry
        self.forward = Forward(entry)
        self.waiting: list[tuple[np.ndarray, asyncio.Future]] = []

    async def predict(self, x: np.ndarray) -> np.ndarray:
        """[rows, input_dim] float32 -> [rows, num_classes] float32 logits."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting.append((x, future))
        if len(self.waiting) == 1:  # the first of a batch schedules its pass
            if self.entry.batch_wait_timeout_s:
                loop.call_later(self.entry.batch_wait_timeout_s, self._run)
            else:
                loop.call_soon(self._run)
        return await future

    def _run(self) -> None:
        batch, self.waiting = (
            self.waiting[: self.entry.max_batch_size],
            self.waiting[self.entry.max_batch_size :],
        )
        if self.waiting:
            asyncio.get_running_loop().call_soon(self._run)
        if not batch:
            return
        try:
            logits = self.forward([x for x, _ in batch])
        except Exception as err:  # noqa: BLE001 - each caller gets the pass's error, as from serve.batch
            for _, future in batch:
                if not future.done():
                    future.set_exception(err)
            return
        for (_, future), answer in zip(batch, logits):
            if not future.done():  # a caller that went away (its request cancelled) is skipped
                future.set_result(answer)


@serve.deployment
class ModelServer:
    """One model; concurrent requests are merged into one forward pass (dynamic batching).

    Returns logits, not probabilities: a cascade takes the softmax, an MoE router combines the
    experts' logits and a gate's logits are routing scores.
    """

    def __init__(self, entry: ModelEntry):
        self.forward = Forward(entry)
        self.predict.set_max_batch_size(entry.max_batch_size)
        self.predict.set_batch_wait_timeout_s(entry.batch_wait_timeout_s)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002)
    async def predict(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        """[rows, input_dim] float32 per request -> [rows, num_classes] float32 logits per request."""
        return self.forward(batches)

    def ready(self) -> bool:
        return True

    def loaded_from(self) -> dict[str, str]:
        """Where this replica's model came from: the artifact, the local weights file it read (its
        node's cache for a URI) and its node."""
        return {
            "artifact": self.forward.model.source,
            "weights": self.forward.model.weights,
            "node_id": ray.get_runtime_context().get_node_id(),
        }
