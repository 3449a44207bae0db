"""`pip install .` ships the Serve apps: from a folder outside the repository, with only the installed
package on the path, `serving.app` and `scaleforge` import and Ray's own `serve run` serves a config."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import yaml

from conftest import REPO
from scaleforge.artifacts.servable import load_servable
from scaleforge.config import ServeConfig
from scaleforge.data import load_mnist1d
from scaleforge.models import MLPSpec
from scaleforge.quickfit import fit_and_save
from serving_env import free_port, v2_body

pytestmark = pytest.mark.slow  # a fresh Ray and Serve started by `serve run` (~40 s)

# The venv's editable install puts a checkout's platform/ on sys.path (a .pth file): drop every path
# entry but the install folder that holds either package, so that only the install can answer.
_ONLY_INSTALLED = """
import sys
from pathlib import Path
target = sys.argv[1]
sys.path[:] = [p for p in sys.path if p == target or not any((Path(p or ".") / name).is_dir()
                                                               for name in ("scaleforge", "serving"))]
import scaleforge, serving.app
print(scaleforge.__file__)
print(serving.app.__file__)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The package as `pip install .` installs it, into a folder outside the repository."""
    source = tmp_path_factory.mktemp("source") / "scaleforge"
    # A copy, so that setuptools' build/ and egg-info neither land in nor come from the checkout.
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info",
                                                                  "__pycache__", ".pytest_cache"))
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=300)
    return target


def _env(target: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    return {**env, "PYTHONPATH": str(target)}


def test_both_packages_import_from_the_install_and_nothing_else(installed, tmp_path):
    out = subprocess.run([sys.executable, "-c", _ONLY_INSTALLED, str(installed)], cwd=tmp_path, env=_env(installed),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [Path(p).relative_to(installed).parts[0] for p in out.stdout.split()] == ["scaleforge", "serving"]
    assert not (installed / "jobs").exists() and not (installed / "tests").exists()


def test_serve_run_serves_a_config_with_the_installed_package(installed, tmp_path):
    data = load_mnist1d(2000, 42, 0.2, "~/.cache/scaleforge")
    artifact = fit_and_save(tmp_path / "tiny", MLPSpec(hidden=[16]), data, epochs=1)
    port = free_port()
    config = {"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": port},
              "applications": [{"name": "installed", "import_path": "serving.app:build_app",
                                "args": {"models": [{"name": "tiny", "artifact": str(artifact), "num_cpus": 0.25}],
                                         "ingress": {"num_cpus": 0.25}}}]}
    ServeConfig.model_validate(config)
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    serve = Path(sys.executable).with_name("serve")
    # RAY_ADDRESS=local: a Ray of its own, never the test session's cluster.
    process = subprocess.Popen([str(serve), "run", "serve.yaml"], cwd=tmp_path,
                               env={**_env(installed), "RAY_ADDRESS": "local"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    x = data["x_test"][:8].astype(np.float32)
    try:
        response = _first_answer(f"http://127.0.0.1:{port}/v2/models/tiny/infer", v2_body(x), process)
    finally:
        os.killpg(process.pid, signal.SIGINT)  # serve run shuts Serve and its Ray down on Ctrl-C
        try:
            log, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            log, _ = process.communicate()
    assert response is not None and response.status_code == 200, log[-3000:]
    classes = next(o for o in response.json()["outputs"] if o["name"] == "class")
    with torch.inference_mode():
        expected = load_servable(artifact).module(torch.from_numpy(x)).argmax(dim=-1)
    assert classes["shape"] == [8] and classes["data"] == expected.tolist()


def _first_answer(url: str, body: dict, process: subprocess.Popen, timeout_s: float = 180):
    """The endpoint's first 200 (its last answer if none came), polled while ``serve run`` deploys the app:
    until then the proxy is not listening, or answers 404 (no such route yet) or 503."""
    deadline, response = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline and process.poll() is None:
        try:
            response = httpx.post(url, json=body, timeout=30)
            if response.status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(1)
    return response
