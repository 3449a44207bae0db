"""Ray's autoscaler on a local simulation of cluster.yaml: nodes come on demand and go when idle.

The head runs Ray's real autoscaler (fake_multinode provider): each "node" it launches is a
raylet on this machine advertising the node type's declared CPUs and GPUs. Drivers run in
subprocesses, as users' jobs do, so this test process stays on the session's own cluster.
"""

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import REPO

from scaleforge.cluster import LocalHead, load_cluster_config, simulated_config

IDLE_TIMEOUT_MINUTES = 0.1  # 6 s: the test config shortens cluster.yaml's 5 minutes

GPU_TASK = """
import json, os, sys, ray
ray.init(logging_level="ERROR")

@ray.remote(num_gpus=1)
def where():
    return os.environ.get("RAY_NODE_TYPE_NAME"), ray.get_gpu_ids()

result = json.dumps(ray.get(where.remote(), timeout=240))
sys.stdout.write(f"RESULT {result}\\n")  # one write: the autoscaler's messages share this stream
sys.stdout.flush()
"""


@pytest.fixture(scope="module")
def cloud():
    config = simulated_config(
        load_cluster_config(REPO / "cluster.yaml"),
        idle_timeout_minutes=IDLE_TIMEOUT_MINUTES,
        max_workers_per_type=2,
    )
    with LocalHead(num_cpus=1, autoscaling_config=config) as head:
        yield head


def _driver(head, code, timeout=300):
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=head.env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # The driver's stdout also carries the autoscaler's messages, written from a thread of their own:
    # the result is what follows the mark, wherever on its line another message left it.
    results = [line.partition("RESULT ")[2] for line in out.stdout.splitlines() if "RESULT " in line]
    assert len(results) == 1, f"stdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-3000:]}"
    return json.loads(results[0])


def _nodes(head, within_s: float = 60) -> list[dict]:
    """Every node the head has seen, alive or dead, from Ray's state API on its dashboard (an HTTP
    call: no driver process to start)."""
    request = urllib.request.Request(
        f"{head.dashboard_url}/api/v0/nodes?limit=1000&detail=true",
        headers={"Authorization": f"Bearer {head.token}"},
    )
    deadline = time.time() + within_s
    while not (nodes := json.load(urllib.request.urlopen(request, timeout=30))["data"]["result"]["result"]):
        assert time.time() < deadline, "the head's state API listed no node, not even the head"
        time.sleep(1)  # the head registers a moment after its dashboard answers
    return nodes


def _alive_gpu_nodes(head) -> list[dict]:
    return [n for n in _nodes(head) if n["state"] == "ALIVE" and n["resources_total"].get("GPU")]


@pytest.mark.slow
def test_gpu_work_launches_the_gpu_node_type_and_the_idle_node_is_removed(cloud):
    assert not _alive_gpu_nodes(cloud), "no GPU node before GPU work is asked for"
    node_type, gpu_ids = _driver(cloud, GPU_TASK)
    assert node_type == "gpu_worker" and len(gpu_ids) == 1
    deadline = time.time() + 120
    while _alive_gpu_nodes(cloud):
        assert time.time() < deadline, "the idle GPU node was not removed within 120 s"
        time.sleep(3)


@pytest.mark.slow
def test_training_that_needs_more_nodes_than_the_head_gets_them_and_completes(cloud, tmp_path):
    # Two workers of 12 CPUs each: the 1-CPU head holds neither, one 16-CPU node holds one.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobs.train",
            "--config",
            "configs/train_dp.yaml",
            "--set",
            "data.num_samples=3000",
            "--set",
            "optim.epochs=1",
            "--set",
            "scaling.num_workers=2",
            "--set",
            "scaling.resources_per_worker={CPU: 12}",
            "--set",
            f"run.storage_path={tmp_path / 'runs'}",
            "--set",
            f"artifact.dir={tmp_path / 'artifact'}",
        ],
        env=cloud.env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "artifact" / "manifest.json").is_file()
    launched = [n for n in _nodes(cloud) if n["resources_total"].get("CPU") == 16]
    assert len(launched) >= 2, launched
