"""Shared fixtures: one real local Ray cluster per test session (logical CPUs on a 2-core machine)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaleforge.runtime import FAST_POLLING, IDLE_WORKER_POOL, worker_logs_to_console
from scaleforge.storage.local_s3 import LocalS3

REPO = Path(__file__).resolve().parents[1]
# Every Ray this session starts, its own and those of the subprocesses it runs (jobs, drills, heads).
for _name, _value in {
    **FAST_POLLING,
    # The pool of idle worker processes an embedded Ray keeps (none prestarted, one per core at most),
    # in every cluster the suite starts: an idle Ray worker still wakes every 10 ms (its core worker's
    # signal check), about 0.5% of a core each, and the session's two clusters live the whole run.
    **IDLE_WORKER_POOL,
    "SCALEFORGE_RAY_DASHBOARD": "0",  # no test opens a dashboard
    # matplotlib's font cache stays where it is when a test gives a process a home of its own
    "MPLCONFIGDIR": str(Path.home() / ".config" / "matplotlib"),
    # Ray's log monitor globs its node's log folder every 0.1 s until it holds 1,000 files;
    # every 2 s instead (2.6% -> 0.9% of a core idle with 195 files; the session's clusters
    # gather hundreds). No test streams worker output: progress travels through a queue.
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "2",
    # One intra-op thread per process unless a test asks for more (torch.set_num_threads): the suite
    # runs two test files at once, each with Ray workers, replicas and jobs of its own, on 2 cores
    # that it keeps 95% busy, where a second OpenMP thread per process only spins against the others.
    "OMP_NUM_THREADS": "1",
    # Ray's usage statistics (no test machine reaches their server): without them Ray Data runs no
    # usage-collecting actor in each cluster it executes on, a process of ~2 CPU-seconds each.
    "RAY_USAGE_STATS_ENABLED": "0",
}.items():
    os.environ.setdefault(_name, _value)
# Credentials for the suite's own S3 server (the `s3` fixture), set before any Ray starts so that
# every worker, replica and job inherits them, as nodes of a cloud cluster get theirs.
LocalS3.credentials()
# Linux's batch scheduling (sched(7): SCHED_BATCH) for this process and, inherited on fork, for every
# process it starts: a process that wakes does not preempt the one running, the scheduler switches at
# its tick instead. Every Ray actor's core worker wakes every 10 ms (its signal check) and the session
# keeps dozens alive on 2 cores that the suite keeps busy; a training worker's thread was preempted
# ~850 times a second under the default policy, ~350 under this one.
if hasattr(os, "SCHED_BATCH"):
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


STARTS_FIRST = (
    "jobs/test_pipeline.py",
    "paramserver/test_async_sgd.py",
    "jobs/test_pipeline_lm.py",
    "jobs/test_submit.py",
    "distributed/test_step_resume.py",
    "serving/test_serve_lm_config.py",
    "cluster/test_autoscaling.py",
    "text/test_lm_job.py",
    "compress/test_compress_job.py",
    "pipeline/test_serve_plan.py",
    "serving/test_serving_http.py",
    "serving/test_installed_package.py",
    "distributed/test_lm_parallel.py",
    "serving/test_serve_autoscaling.py",
    "distributed/test_dp_training.py",
    "distributed/test_moe_training.py",
    "compress/test_compress_lm.py",
    "serving/test_deploy.py",
    "distributed/test_model_parallel.py",
    "models/test_early_exit.py",
    "generate/test_engine.py",
    "serving/test_generator.py",
)
"""Every test file of 20 s or more, longest first (one fresh-clone run of the suite here: 269, 209,
116, 102, 101, 75, 70, 67, 60, 60, 59, 59, 51, 51, 49, 48, 41, 38, 29, 28, 22, 20 s). `make test` runs
files on two workers (pytest-xdist, a file per worker at a time), handing the next file to whichever
worker is free: longest first, the run ends on short files on both workers. With only the seven longest
first, that run's workers ended 43 s apart (901 and 944 s), a 60-75 s serving file last on one of them;
in this order the same files' durations give 920 and 924 s. The rest follow in their usual order."""


def pytest_collection_modifyitems(config, items):
    def order(item) -> int:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return STARTS_FIRST.index(path) if path in STARTS_FIRST else len(STARTS_FIRST)

    items.sort(key=order)  # stable: within a file and among the rest, collection order stays


@pytest.fixture(scope="session")
def metrics_port() -> int:
    """Where the session cluster's node exports Ray's metrics in Prometheus format (``/metrics``): a port
    outside the ephemeral range (``scaleforge.cluster.free_ports``), which the other xdist worker's
    clusters cannot take between this pick and Ray's bind (77 tests in error once)."""
    from scaleforge.cluster import free_ports

    return free_ports(1)[0]


@pytest.fixture(scope="session")
def ray_cluster(metrics_port):
    import ray

    # address="local": a fresh cluster even if another local one (or a stale address file) exists.
    # Worker and replica output stays in Ray's log folder, as for our jobs (SCALEFORGE_WORKER_LOGS=1
    # streams it).
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        _metrics_export_port=metrics_port,
        log_to_driver=worker_logs_to_console(),
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def s3():
    """The session's S3 server (moto's, a process of its own on 127.0.0.1) and its bucket
    ``scaleforge-test``."""
    with LocalS3() as server:
        yield server


@pytest.fixture(autouse=True)
def _free_what_a_failed_test_reserved(request):
    """After a test on the shared cluster: remove placement groups it left behind (with the actors
    in them), so that one failure cannot starve every later test of CPUs. A leak is reported."""
    yield
    if "ray_cluster" not in request.fixturenames:
        return
    import warnings

    import ray
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    if not ray.is_initialized():
        return
    for group_id, info in placement_group_table().items():
        if info["state"] in ("PENDING", "CREATED", "RESCHEDULING"):
            warnings.warn(
                f"{request.node.nodeid} left placement group {group_id} ({info['state']}); removed it",
                stacklevel=1,  # the fixture's own line: the test that leaked is named in the message
            )
            remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(group_id))))


@pytest.fixture(scope="module", autouse=True)
def _serve_down_after_a_serving_file(request):
    """Shut the session's Serve down once a file under ``tests/serving`` is done with it. An idle Serve
    is not free: its controller, its proxy and each replica poll, about 18% of a core with one app of
    two replicas, which the rest of the suite on that xdist worker would pay for minutes. The next
    file that needs Serve starts it again (``serving_env.running_serve``), on the same port."""
    yield
    if request.path.parent.name != "serving":
        return
    import ray

    if ray.is_initialized():
        from ray import serve

        serve.shutdown()  # a no-op where the file started none


def run_plan(config: str, *sets: str) -> subprocess.CompletedProcess:
    """``python -m jobs.train --config CONFIG --plan --set ...`` as a user types it (no Ray is reached)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "jobs.train",
            "--config",
            config,
            "--plan",
            *(a for s in sets for a in ("--set", s)),
        ],
        cwd=REPO,
        env={**os.environ, "RAY_ADDRESS": ""},
        capture_output=True,
        text=True,
        timeout=180,
    )
