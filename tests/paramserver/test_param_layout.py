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
