"""A worker's gradients reach a shard on its node through shared memory, and any other shard
through the object store; a shard that cannot read a shared gradient asks for the array."""

import uuid

import numpy as np
import pytest

from scaleforge.paramserver.consistency import Async
from scaleforge.paramserver.outbox import RESEND, Outbox, SharedGradient, buffer_path, remove_buffers
from scaleforge.paramserver.shard import ParameterShard
from scaleforge.paramserver.specs import ShardSpec


@pytest.fixture
def shards(ray_cluster):
    """Two async SGD shards (lr 0.5, no momentum) over a 6-element vector."""
    actors = [
        ParameterShard.remote(
            i,
            np.zeros(3, np.float32),
            ShardSpec(Async(), num_workers=1, optimizer="sgd", lr=0.5, momentum=0.0),
        )
        for i in range(2)
    ]
    yield actors
    for actor in actors:
        ray_cluster.kill(actor)


def _weights(ray, shards):
    return np.concatenate([ray.get(s.snapshot.remote())[0] for s in shards])


def test_a_shard_on_the_workers_node_applies_the_gradient_in_place(ray_cluster, shards):
    token = uuid.uuid4().hex[:12]
    outbox = Outbox(0, shards, [(0, 3), (3, 6)], token)
    assert outbox.local == [True, True] and outbox.path == str(buffer_path(token, 0))
    for step, grad in enumerate([np.arange(6, dtype=np.float32), np.ones(6, np.float32)]):
        outbox.buffer[:] = grad  # what the backward pass writes
        acks = outbox.push([(step, step)] * 2, step)
        assert [version for version, _ in acks] == [step + 1, step + 1]
    np.testing.assert_allclose(_weights(ray_cluster, shards), -0.5 * (np.arange(6) + 1))
    outbox.close()
    assert not buffer_path(token, 0).exists()


def test_a_shard_that_cannot_read_the_note_gets_the_array(ray_cluster, shards):
    token = uuid.uuid4().hex[:12]
    outbox = Outbox(0, shards, [(0, 3), (3, 6)], token)
    elsewhere = SharedGradient(outbox.path, "0" * 56, 0)  # a buffer on some other node
    assert ray_cluster.get(shards[0].push.remote(0, elsewhere, 0, 0, 0)) == RESEND
    assert ray_cluster.get(shards[0].stats.remote())["version"] == 0  # nothing applied

    outbox.node_id = "0" * 56  # as if this worker's shards had restarted on another node
    outbox.buffer[:] = 2.0
    acks = outbox.push([(0, 0)] * 2, 0)
    assert [version for version, _ in acks] == [1, 1] and outbox.local == [False, False]
    np.testing.assert_allclose(_weights(ray_cluster, shards), -1.0)
    remove_buffers(token)  # the driver's clean-up, for a worker that could not close
    assert not buffer_path(token, 0).exists()
