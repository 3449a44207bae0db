"""bench/peers/plain_server.py started under uvicorn, as bench/serving.py runs it."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from serving_parts.common import MODEL_PROCESSES, REPO


@contextlib.contextmanager
def plain_server(artifact: str, name: str):
    """bench/peers/plain_server.py under uvicorn (``MODEL_PROCESSES`` workers) on a free port: yields
    its base URL."""
    port = free_port()
    env = {**os.environ, "PLAIN_ARTIFACT": artifact, "PLAIN_MODEL": name}
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "plain_server:app",
        "--app-dir",
        str(REPO / "bench" / "peers"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(MODEL_PROCESSES),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(f"{base}/v2/health/ready", process)
        yield base
    finally:
        process.terminate()  # uvicorn's supervisor stops its workers
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 120) -> None:
    """Poll ``url`` until every worker has answered (a worker answers once its model is loaded)."""
    deadline, workers = time.monotonic() + timeout_s, set()
    while len(workers) < MODEL_PROCESSES:
        if process.poll() is not None:
            raise RuntimeError(f"uvicorn exited with status {process.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"uvicorn at {url}: {len(workers)} of {MODEL_PROCESSES} workers ready after {timeout_s:.0f} s"
            )
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            workers.add(httpx.get(url, timeout=2).json()["pid"])
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
