"""bench/peers/plain_cascade.py started under uvicorn, as bench/serving.py runs it."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from serving_parts.common import REPO


@contextlib.contextmanager
def plain_server(paths: dict[str, str], threshold: float, workers: int, merged: dict[str, int]):
    """bench/peers/plain_cascade.py under uvicorn (``workers`` workers) on a free port, serving
    the student, the teacher and the cascade at ``threshold``, merging at most ``merged[model]`` calls
    of a model into one pass: yields its base URL."""
    env = {
        "PLAIN_STUDENT": paths["student"],
        "PLAIN_TEACHER": paths["teacher"],
        "PLAIN_THRESHOLD": repr(threshold),
        "PLAIN_STUDENT_MERGED": str(merged["student"]),
        "PLAIN_TEACHER_MERGED": str(merged["teacher"]),
    }
    with uvicorn_server("plain_cascade:app", env, workers, "/v2/health/ready") as base:
        yield base


@contextlib.contextmanager
def uvicorn_server(app: str, env: dict[str, str], workers: int, ready_path: str):
    """``app`` (``module:attribute`` in bench/peers) under uvicorn with ``workers`` workers on a free port
    of 127.0.0.1, ``env`` added to the environment; yields its base URL once every worker answers
    ``ready_path`` (with its ``pid``), and stops it on leaving."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        app,
        "--app-dir",
        str(REPO / "bench" / "peers"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    process = subprocess.Popen(
        command, env={**os.environ, **env}, stdout=subprocess.DEVNULL, start_new_session=True
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(f"{base}{ready_path}", process, workers)
        yield base
    finally:
        process.terminate()  # uvicorn's supervisor stops its workers
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_ready(url: str, process: subprocess.Popen, expected: int, timeout_s: float = 120) -> None:
    """Poll ``url`` until every worker has answered (a worker answers once its model is loaded)."""
    deadline, workers = time.monotonic() + timeout_s, set()
    while len(workers) < expected:
        if process.poll() is not None:
            raise RuntimeError(f"uvicorn exited with status {process.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"uvicorn at {url}: {len(workers)} of {expected} workers ready after {timeout_s:.0f} s"
            )
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            workers.add(httpx.get(url, timeout=2).json()["pid"])
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
