"""`ray job submit` against a real head with token authentication, as a user submits work."""

import json
import re
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO
from scaleforge.artifacts import load_artifact

RAY = str(Path(sys.executable).with_name("ray"))
RUNTIME_ENV = json.dumps({"py_modules": ["platform/scaleforge"]})


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture(scope="module")
def head():
    """A Ray head started with `ray start --head --block` on free ports, token auth on."""
    gcs, dashboard, agent, agent_grpc, metrics, runtime_env, client = _free_ports(7)
    token = secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token,
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    # Its own temp dir, so this head never becomes the machine's "current cluster" for ray.init().
    temp_dir = tempfile.mkdtemp(prefix="sfray", dir="/tmp")
    proc = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--num-cpus=4", "--disable-usage-stats", f"--temp-dir={temp_dir}",
         "--node-ip-address=127.0.0.1", f"--port={gcs}", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard}", f"--dashboard-agent-listen-port={agent}",
         f"--dashboard-agent-grpc-port={agent_grpc}", f"--metrics-export-port={metrics}",
         f"--runtime-env-agent-port={runtime_env}", f"--ray-client-server-port={client}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    address = f"http://127.0.0.1:{dashboard}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{address}/api/version", timeout=2)
            break
        except urllib.error.HTTPError:
            break  # the dashboard answers (401 without a token): it is up
        except OSError:
            assert proc.poll() is None, "ray start --head exited"
            time.sleep(1)
    else:
        proc.terminate()
        pytest.fail("the Ray head's dashboard did not come up within 120 s")
    yield address, env
    proc.terminate()
    proc.wait(timeout=60)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _ray(args, env, timeout=600):
    return subprocess.run([RAY, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _submit(address, env, submission_id, *entrypoint):
    out = _ray(["job", "submit", "--address", address, "--submission-id", submission_id,
                "--working-dir", ".", "--runtime-env-json", RUNTIME_ENV, "--", *entrypoint], env)
    status = _ray(["job", "status", "--address", address, submission_id], env, timeout=120)
    logs = _ray(["job", "logs", "--address", address, submission_id], env, timeout=120).stdout
    return out, re.sub(r"\x1b\[[0-9;]*m", "", status.stdout), logs


@pytest.mark.slow
def test_submitted_training_job_succeeds_and_writes_the_artifact(head, tmp_path):
    address, env = head
    submission_id = f"sf-train-{secrets.token_hex(3)}"
    out, status, logs = _submit(
        address, env, submission_id,
        sys.executable, "-m", "jobs.train", "--config", "configs/train_dp.yaml",
        "--set", "data.num_samples=4000", "--set", "optim.epochs=3",
        "--set", f"run.storage_path={tmp_path / 'runs'}", "--set", f"artifact.dir={tmp_path / 'artifact'}",
    )
    assert f"Job '{submission_id}' succeeded" in status, out.stdout + out.stderr + logs
    assert "[train] epoch 3/3" in logs
    artifact = load_artifact(tmp_path / "artifact")
    assert artifact.manifest["dataset"]["num_train"] == 3200
    assert artifact.manifest["metrics"]["test_accuracy"] > 0.5
    assert f"artifact: {tmp_path / 'artifact'}" in logs


@pytest.mark.slow
def test_stdlib_platform_inside_a_submitted_job(head):
    address, env = head
    code = "import platform, ray; ray.init(); print('system=' + platform.system(), platform.__file__)"
    submission_id = f"sf-platform-{secrets.token_hex(3)}"
    _, status, logs = _submit(address, env, submission_id, sys.executable, "-c", code)
    assert f"Job '{submission_id}' succeeded" in status, logs
    assert "system=Linux" in logs and "/working_dir_files/" not in logs.split("system=Linux")[1].split()[0]


@pytest.mark.slow
def test_token_authentication_is_enforced(head):
    address, env = head
    wrong = _ray(["job", "list", "--address", address], {**env, "RAY_AUTH_TOKEN": "0" * 64}, timeout=120)
    assert wrong.returncode != 0
    assert "auth" in (wrong.stdout + wrong.stderr).lower()
    right = _ray(["job", "list", "--address", address], env, timeout=120)
    assert right.returncode == 0, right.stderr
