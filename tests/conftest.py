"""Shared fixtures: one real local Ray cluster per test session (logical CPUs on a 2-core machine)."""

import os
from pathlib import Path

import pytest

from scaleforge.runtime import FAST_POLLING

REPO = Path(__file__).resolve().parents[1]
# Every Ray this session starts, its own and those of the subprocesses it runs (jobs, drills, heads).
for _name, _value in FAST_POLLING.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    # address="local": a fresh cluster even if another local one (or a stale address file) exists.
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    yield ray
    ray.shutdown()
