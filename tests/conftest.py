"""Shared fixtures: one real local Ray cluster per test session (logical CPUs on a 2-core machine)."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    # address="local": a fresh cluster even if another local one (or a stale address file) exists.
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    yield ray
    ray.shutdown()
