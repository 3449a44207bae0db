"""configs/serve_lm.yaml as a user runs it, its artifacts swapped for small ones trained here: through
``python -m jobs.serve`` and through Ray's own ``serve run``, each on a Ray of its own, `curl` and the
``openai`` client, streaming and not, get text from every generator it ships."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import openai
import pytest
import torch
import yaml
from conftest import REPO
from lm_env import DRAFTER, TARGET, trained_lms
from serving_env import free_port

from scaleforge.artifacts import save_artifact
from scaleforge.artifacts.store import load_model
from scaleforge.text.tokenizer import ByteTokenizer

pytestmark = pytest.mark.slow  # two Rays of their own, one after the other (about a minute)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """configs/serve_lm.yaml with every artifact replaced by a small one of its kind, on a free port."""
    folder = tmp_path_factory.mktemp("serve-lm")
    lms = trained_lms(tmp_path_factory)
    paths = {"teacher": lms["target"], "student": lms["drafter"]}
    for name, spec in (("teacher", TARGET), ("student", DRAFTER)):
        quantized = torch.ao.quantization.quantize_dynamic(load_model(paths[name]), {torch.nn.Linear})
        paths[f"{name}-int8"] = str(
            save_artifact(
                folder / f"{name}-int8",
                quantized,
                spec,
                input_dim=64,
                num_classes=256,
                extra={"tokenizer": ByteTokenizer().to_json()},
                architecture=[{"op": "quantize", "scheme": "int8_dynamic"}],
            )
        )
    config = yaml.safe_load((REPO / "configs" / "serve_lm.yaml").read_text())
    config["http_options"]["port"] = free_port()
    args = config["applications"][0]["args"]
    args["ingress"]["replicas"] = 1  # every setting as shipped but the replica count: one starts faster
    for model in args["models"]:
        model["artifact"] = paths[model["name"]]
    path = folder / "serve_lm.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, config


def _wait_for_text(base: str, process: subprocess.Popen, log, within_s: float = 240) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert process.poll() is None, (
            f"the server exited with {process.returncode}: {log.read_text()[-3000:]}"
        )
        try:
            if httpx.get(f"{base}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise AssertionError(f"{base}/v1/models did not answer within {within_s} s: {log.read_text()[-3000:]}")


IN_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)
"""Runs a command with Ctrl-C's signal at its default, as a terminal starts it. Where the suite runs as a
shell's background job (CI), SIGINT is ignored and every process it starts inherits that: Ctrl-C was
then lost on the servers here, each ran out the 60 s stop timeout, and the process group's SIGKILL left
the Ray's other processes (HAProxy among them) serving the port into the next server's test."""


def _stop(process: subprocess.Popen) -> None:
    """Ctrl-C: the server stops within a minute, or the test fails (after killing its process group)."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
        return
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    raise AssertionError("the server did not stop within 60 s of Ctrl-C")  # chained to a failure before it


def _check_every_generator(base: str, config: dict) -> None:
    names = [r["name"] for r in config["applications"][0]["args"]["routers"] if r["kind"] == "generator"]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    assert sorted(m.id for m in client.models.list().data) == sorted(names)
    for name in names:
        whole = client.completions.create(model=name, prompt="import ", max_tokens=12, temperature=0)
        streamed = client.completions.create(
            model=name, prompt="import ", max_tokens=12, temperature=0, stream=True
        )
        assert whole.usage.completion_tokens == 12
        assert "".join(chunk.choices[0].text for chunk in streamed) == whole.choices[0].text, name
    if shutil.which("curl"):
        body = '{"model": "lm", "prompt": "def ", "max_tokens": 8, "stream": true}'
        out = subprocess.run(
            ["curl", "-sN", f"{base}/v1/completions", "-H", "content-type: application/json", "-d", body],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        events = [line for line in out.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 3, out


@pytest.mark.parametrize("command", ["jobs.serve", "serve run"])
def test_serve_lm_yaml_serves_text_through_jobs_serve_and_serve_run(config, command, tmp_path):
    path, loaded = config
    argv = (
        [sys.executable, "-m", "jobs.serve", "--config", str(path)]
        if command == "jobs.serve"
        else [str(os.path.join(os.path.dirname(sys.executable), "serve")), "run", str(path)]
    )
    argv = [sys.executable, "-c", IN_A_TERMINAL, *argv]
    # A Ray of its own: its own temporary folder (short: Ray's socket paths must fit 107 bytes).
    ray_tmp = tempfile.mkdtemp(prefix="sf-lm-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": ray_tmp}
    log = tmp_path / "server.log"
    with log.open("w") as out:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=out, start_new_session=True)
    base = f"http://127.0.0.1:{loaded['http_options']['port']}"
    try:
        began = time.monotonic()
        _wait_for_text(base, process, log)
        answering = time.monotonic()
        _check_every_generator(base, loaded)
        requests = time.monotonic() - answering
        print(f"{command}: answering after {answering - began:.1f} s, requests {requests:.1f} s")
    finally:
        _stop(process)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    # Stopped by Ctrl-C, it leaves nothing serving: the next server can take the port.
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port's closed connections linger
        try:
            probe.bind(("127.0.0.1", loaded["http_options"]["port"]))
        except OSError as error:
            raise AssertionError(f"{base} is still taken after the server stopped: {error}") from None
