"""Shared fixtures: one real local Ray cluster per test session (logical CPUs on a 2-core machine)."""

import os
from pathlib import Path

import pytest

from scaleforge.runtime import FAST_POLLING

REPO = Path(__file__).resolve().parents[1]
# Every Ray this session starts, its own and those of the subprocesses it runs (jobs, drills, heads).
for _name, _value in {**FAST_POLLING, "SCALEFORGE_RAY_DASHBOARD": "0"}.items():  # no test opens a dashboard
    os.environ.setdefault(_name, _value)
# Credentials for the suite's own S3 server (the `s3` fixture), set before any Ray starts so that
# every worker, replica and job inherits them, as nodes of a cloud cluster get theirs.
for _name, _value in {"AWS_ACCESS_KEY_ID": "scaleforge-test", "AWS_SECRET_ACCESS_KEY": "scaleforge-test",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def metrics_port() -> int:
    """Where the session cluster's node exports Ray's metrics in Prometheus format (``/metrics``)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_cluster(metrics_port):
    import ray

    # address="local": a fresh cluster even if another local one (or a stale address file) exists.
    ray.init(address="local", num_cpus=4, include_dashboard=False, _metrics_export_port=metrics_port)
    yield ray
    ray.shutdown()


class S3Server:
    """A real S3 API server on 127.0.0.1 (moto's standalone server, a process of its own) with one bucket."""

    bucket = "scaleforge-test"

    def __init__(self, port: int):
        self.endpoint = f"127.0.0.1:{port}"

    def uri(self, key: str, bucket: str = bucket) -> str:
        """``s3://<bucket>/<key>?endpoint_override=...``: what a user writes for a bucket on this server."""
        return f"s3://{bucket}/{key.strip('/')}?endpoint_override={self.endpoint}&scheme=http"


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """The session's S3 server, started on a free port; its bucket exists."""
    import socket
    import subprocess
    import sys
    import time

    import pyarrow.fs

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(tmp_path_factory.mktemp("s3") / "moto.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the S3 server did not start"
                time.sleep(0.1)
        found = S3Server(port)
        pyarrow.fs.S3FileSystem(endpoint_override=found.endpoint, scheme="http",
                                allow_bucket_creation=True).create_dir(S3Server.bucket)
        yield found
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


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
            warnings.warn(f"{request.node.nodeid} left placement group {group_id} ({info['state']}); removed it")
            remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(group_id))))
