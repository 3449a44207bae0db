"""bench/serving.py's CPU per request: uvicorn's worker processes count as the server, this process as
the load generator."""

import os
import socket
import subprocess
import sys
import time

import httpx
import psutil

from bench.serving_parts.cpu import CpuSplit, server_cpu_s

APP = """
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": str(__import__("os").getpid()).encode()})
"""


def test_uvicorns_workers_are_the_server_and_this_process_the_client(tmp_path):
    (tmp_path / "tiny_app.py").write_text(APP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tiny_app:app", "--app-dir", str(tmp_path), "--workers", "2"]
        + ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
    )
    try:
        deadline = time.monotonic() + 60
        workers: set[int] = set()
        while len(workers) < 2:  # both worker processes spawned
            assert time.monotonic() < deadline and server.poll() is None, "uvicorn did not start"
            time.sleep(0.2)
            children = psutil.Process(server.pid).children()
            workers = {c.pid for c in children if "spawn_main" in " ".join(c.cmdline())}
        while True:
            assert time.monotonic() < deadline and server.poll() is None, "uvicorn did not answer"
            try:
                assert int(httpx.get(f"http://127.0.0.1:{port}/").text) in workers
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert set(server_cpu_s()) >= workers and server.pid not in server_cpu_s()
        with CpuSplit() as split:
            busy_until = time.process_time() + 0.3
            while time.process_time() < busy_until:
                pass
        per_request = split.per_request_ms(10)
        assert per_request["cpu_client_ms"] >= 25.0, per_request  # 0.3 s of this process over 10 requests
        assert set(per_request) == {"cpu_server_ms", "cpu_client_ms", "cpu_rest_ms"}
        assert min(per_request.values()) >= 0.0
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert os.getpid() not in server_cpu_s()
