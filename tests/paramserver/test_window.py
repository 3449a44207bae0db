"""A worker on a shard's node reads the shard's parameters from shared memory, never half of an
update, with the version it read; a worker elsewhere gets the array."""

import threading
import uuid

import numpy as np
import torch

from scaleforge.models import MLPSpec, build_model
from scaleforge.paramserver import ParamLayout
from scaleforge.paramserver.consistency import Async
from scaleforge.paramserver.shard import ParameterShard
from scaleforge.paramserver.specs import ShardSpec
from scaleforge.paramserver.window import SharedSlice, WindowReader, window_path


def _shard(size: int, token: str):
    return ParameterShard.remote(
        0,
        np.zeros(size, np.float32),
        ShardSpec(Async(), num_workers=1, optimizer="sgd", lr=1.0, momentum=0.0, run_token=token),
    )


def test_a_worker_on_the_shards_node_reads_shared_memory_and_one_elsewhere_gets_the_array(ray_cluster):
    ray, token = ray_cluster, uuid.uuid4().hex[:12]
    shard, here = _shard(4, token), ray_cluster.get_runtime_context().get_node_id()
    try:
        ray.get(shard.push.remote(0, np.arange(4, dtype=np.float32), 0, 0, 0))
        note, version, slowest = ray.get(shard.pull.remote(0, 1, here))
        assert (
            isinstance(note, SharedSlice)
            and note.path == str(window_path(token, 0))
            and (version, slowest) == (1, 1)
        )
        out = np.empty(4, np.float32)
        assert WindowReader().copy(note, out) == 1
        np.testing.assert_array_equal(out, -np.arange(4))
        values, version, _ = ray.get(shard.pull.remote(0, 1, "0" * 56))  # a worker on another node
        np.testing.assert_array_equal(values, -np.arange(4))
        assert version == 1
        ray.get(shard.close.remote())
        assert not window_path(token, 0).exists()
    finally:
        ray.kill(shard)


def test_a_read_never_sees_half_of_an_update_and_names_the_version_it_read(ray_cluster):
    """Every update subtracts 1 from all 4M values (lr 1, gradient of ones), so a whole read is
    constant and equals minus its version; updates run all the while the reads copy."""
    ray, token = ray_cluster, uuid.uuid4().hex[:12]
    size = 4 << 20
    shard = _shard(size, token)
    try:
        note, _, _ = ray.get(shard.pull.remote(0, 0, ray_cluster.get_runtime_context().get_node_id()))
        ones, done, acked = ray.put(np.ones(size, np.float32)), threading.Event(), threading.Condition()
        latest = [0]

        def update():
            version = 0
            while not done.is_set() and version < 400:
                version, _ = ray.get(shard.push.remote(0, ones, version, 0, 0))
                with acked:
                    latest[0] = version
                    acked.notify()

        writer = threading.Thread(target=update)
        writer.start()
        reader, out, versions = WindowReader(), np.empty(size, np.float32), []
        try:
            # Until the reads have seen a dozen versions, each read while the writer's next update is
            # applied: after a read, the next waits for the shard to acknowledge a newer version (the
            # writer sends the following push at once). Reading back to back instead, this process
            # (nice 0) took the cores from the shard (a Ray worker: nice 15) that it waited for, and a
            # loaded suite's run made up to 3,000 reads of 16 MB.
            while len(set(versions)) <= 10 and len(versions) < 3000:
                version = reader.copy(note, out)
                assert out.min() == out.max() == -version, (out.min(), out.max(), version)
                versions.append(version)
                with acked:
                    acked.wait_for(lambda read=version: latest[0] > read or not writer.is_alive(), timeout=30)
        finally:
            done.set()
            writer.join()
        assert versions == sorted(versions) and len(set(versions)) > 10  # the reads did overlap updates
        ray.get(shard.close.remote())
    finally:
        ray.kill(shard)


def test_bind_makes_the_parameters_views_of_one_vector_keeping_their_values():
    torch.manual_seed(0)
    model = build_model(MLPSpec(hidden=[8]), 5, 3)
    layout = ParamLayout.of(model)
    before = layout.flatten(model).copy()
    flat = layout.bind(model)
    np.testing.assert_array_equal(flat, before)
    flat[:] = np.arange(layout.total, dtype=np.float32)
    np.testing.assert_array_equal(layout.flatten(model), np.arange(layout.total))
    assert model(torch.zeros(1, 5)).shape == (1, 3)
