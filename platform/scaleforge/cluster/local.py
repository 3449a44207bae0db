"""A Ray head of its own on this machine: for ``ray job submit`` tests and the autoscaling simulation.

``ray start --head --block`` on free ports, in a temp dir of its own (so it never becomes the
machine's "current cluster" that a plain ``ray.init()`` would join), with token authentication
on. Unlike ``ray.cluster_utils.AutoscalingCluster`` it never runs ``ray stop --force``, which
would kill every Ray process on the machine, other sessions' included: stopping ends the head's
own ``ray start`` process and then whatever still runs in its temp dir (the fake nodes an
autoscaler launched).
"""

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

import psutil

RAY = str(Path(sys.executable).with_name("ray"))


FREE_PORT_RANGE = range(20000, 30000)
"""Where :func:`free_ports` draws from: below Linux's ephemeral range (32768-60999, what ``bind(0)`` and
every outgoing connection take), between Ray's worker ports (10002-19999) and Serve's direct-ingress
ports (30000-31000). A port from ``bind(0)`` can be handed to another process before the one it was
picked for binds it: in a fresh-clone suite run a session cluster's dashboard agent failed so ("Address
already in use") while another cluster bound dozens of ephemeral ports, and its raylet died with it."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports in :data:`FREE_PORT_RANGE`, free on every interface right now."""
    rng, sockets = random.Random(), []
    try:
        for _ in range(50 * count):
            if len(sockets) == count:
                break
            s = socket.socket()
            try:
                s.bind(("", rng.choice(FREE_PORT_RANGE)))
            except OSError:  # taken, or already held by this call
                s.close()
                continue
            sockets.append(s)
        if len(sockets) < count:
            raise RuntimeError(f"{count} free ports wanted in {FREE_PORT_RANGE}, found {len(sockets)}")
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class LocalHead:
    """A Ray head on 127.0.0.1, started and stopped as a unit (a context manager).

    Args:
        num_cpus: logical CPUs the head advertises.
        autoscaling_config: a ``fake_multinode`` config (see ``simulated_config``): the head then
            runs Ray's autoscaler, which launches and removes fake nodes on this machine.
        resources: custom resources of the head.
        environment: variables the head, its workers and every driver or CLI call against it get
            (e.g. ``PYTHONPATH`` of an installed package, as a node where it is installed has it).
    """

    def __init__(
        self,
        num_cpus: float = 4,
        *,
        autoscaling_config: Optional[dict[str, Any]] = None,
        resources: Optional[dict[str, float]] = None,
        environment: Optional[dict[str, str]] = None,
    ):
        self.num_cpus, self.autoscaling_config, self.resources = num_cpus, autoscaling_config, resources or {}
        self.environment = environment or {}
        self.token = secrets.token_hex(32)
        self.temp_dir = tempfile.mkdtemp(prefix="sfray", dir="/tmp")  # short: socket paths are limited
        self.gcs_port, self.dashboard_port, *self._other_ports = free_ports(7)
        self.process: Optional[subprocess.Popen] = None

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a driver or CLI call against this head (address and token set)."""
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(self.environment)
        env.update(
            RAY_ADDRESS=self.gcs_address,
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=self.token,
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            **extra,
        )
        return env

    def start(self, timeout_s: float = 120) -> "LocalHead":
        agent, agent_grpc, metrics, runtime_env, client = self._other_ports
        command = [
            RAY,
            "start",
            "--head",
            "--block",
            f"--num-cpus={self.num_cpus}",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
            "--node-ip-address=127.0.0.1",
            f"--port={self.gcs_port}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--metrics-export-port={metrics}",
            f"--runtime-env-agent-port={runtime_env}",
            f"--ray-client-server-port={client}",
        ]
        if self.resources:
            command.append(f"--resources={json.dumps(self.resources)}")
        env = self.env()
        env.pop("RAY_ADDRESS")
        if self.autoscaling_config is not None:
            config = dict(
                self.autoscaling_config,
                provider={**self.autoscaling_config["provider"], "gcs_address": self.gcs_address},
            )
            path = Path(self.temp_dir) / "autoscaling.json"
            path.write_text(json.dumps(config))
            command.append(f"--autoscaling-config={path}")
            env.update(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait_for_dashboard(timeout_s)
        return self

    def _wait_for_dashboard(self, timeout_s: float) -> None:
        try:
            wait_for_dashboard(self.dashboard_url, timeout_s, lambda: self.process.poll() is None)
        except RuntimeError:
            raise RuntimeError(f"ray start --head exited with {self.process.returncode}") from None
        except TimeoutError:
            self.stop()
            raise

    def stop(self) -> None:
        """End the head, every process it started and every process still running from its temp dir;
        remove the temp dir."""
        # Taken before the head goes: Ray's agents and workers retitle themselves ("ray::DashboardAgent"),
        # so their command lines no longer name the temp dir, and once the raylet is gone they are orphans
        # that outlive it (seen: a dashboard agent busy at ~13% of a core after its head had stopped).
        started = []
        if self.process is not None:
            try:
                started = psutil.Process(self.process.pid).children(recursive=True)
            except psutil.Error:
                pass
        if self.process is not None and self.process.poll() is None:
            # `ray start --block` stops its processes on SIGTERM, politely and slowly (~30 s); what
            # is left after a few seconds is killed below.
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        for process in [*started, *psutil.process_iter(["cmdline"])]:
            try:
                if process in started or any(self.temp_dir in part for part in process.cmdline() or []):
                    process.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "LocalHead":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_for_dashboard(url: str, timeout_s: float, running: Callable[[], bool] = lambda: True) -> None:
    """Until the dashboard at ``url`` answers (401 without a token counts: it is up).

    Raises:
        RuntimeError: ``running()`` says the head is gone.
        TimeoutError: no answer within ``timeout_s``.
    """
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if not running():
                raise RuntimeError(f"the Ray head of {url} is gone") from None
            time.sleep(1)
    raise TimeoutError(f"the Ray head's dashboard did not come up within {timeout_s:.0f} s")
