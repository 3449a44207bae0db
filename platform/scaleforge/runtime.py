"""Connecting to Ray: the cluster of a submitted job, or an embedded local one."""

import os

import ray

FAST_POLLING = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
"""Ray Train's controller polls its workers every 2 s by default, and every state change (started,
finished) waits for a poll: on an embedded Ray, where a poll is cheap, each run then ends ~3 s sooner."""


def ensure_ray(min_cpus: float) -> None:
    """Join the job's cluster, or start an embedded local Ray with enough logical CPUs.

    Under ``ray job submit`` (``RAY_ADDRESS`` set) this connects to that cluster. Otherwise a
    local Ray starts in-process with at least ``min_cpus`` logical CPUs, so a 2-core machine
    can still host several workers plus Ray Data's tasks. Token authentication is left as
    Ray configures it (on by default for new local clusters since Ray 2.52).
    """
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)
        return
    for name, value in FAST_POLLING.items():
        os.environ.setdefault(name, value)
    # address="local": always a fresh embedded instance, never a stale or foreign local cluster
    # that ray.init() would otherwise try to join (set RAY_ADDRESS=auto to use one on purpose).
    ray.init(address="local", num_cpus=max(float(os.cpu_count() or 1), min_cpus))
