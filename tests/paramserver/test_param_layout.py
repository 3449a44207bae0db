"""Flat parameter layout and byte-balanced shard ranges."""

import numpy as np
import pytest
import torch

from scaleforge.models import MLPSpec, build_model
from scaleforge.paramserver import ParamLayout


def test_flatten_assign_round_trip():
    torch.manual_seed(0)
    source, target = build_model(MLPSpec(hidden=[8]), 5, 3), build_model(MLPSpec(hidden=[8]), 5, 3)
    layout = ParamLayout.of(source)
    flat = layout.flatten(source)
    assert flat.dtype == np.float32 and flat.shape == (layout.total,) == (5 * 8 + 8 + 8 * 3 + 3,)
    layout.assign(target, flat)
    for a, b in zip(source.parameters(), target.parameters()):
        assert torch.equal(a, b)


def test_shards_are_contiguous_and_balanced():
    layout = ParamLayout(("w",), ((10, 10),))
    ranges = layout.shard_ranges(3)
    assert ranges[0][0] == 0 and ranges[-1][1] == 100
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1
    with pytest.raises(ValueError, match="between 1 and the parameter count"):
        layout.shard_ranges(101)


def test_a_shard_rebuilds_exactly_the_initial_slice_the_driver_made():
    """Shards get a description of their slice (spec, seed, range), not a copy: rebuilt, it is the same."""
    from scaleforge.models import CNN1dSpec
    from scaleforge.paramserver.layout import InitialSlice

    spec = CNN1dSpec(batch_norm=False, channels=[4, 8], hidden=16)
    torch.manual_seed(7)
    model = build_model(spec, 40, 10)
    layout = ParamLayout.of(model)
    flat = layout.flatten(model)
    for start, stop in layout.shard_ranges(3):
        rebuilt = InitialSlice(spec.model_dump(mode="json"), 7, 40, 10, start, stop).values()
        np.testing.assert_array_equal(rebuilt, flat[start:stop])
    assert not np.array_equal(
        InitialSlice(spec.model_dump(mode="json"), 8, 40, 10, 0, 10).values(), flat[:10]
    )
