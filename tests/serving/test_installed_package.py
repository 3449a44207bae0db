"""`pip install .` ships the Serve apps: from a folder outside the repository, with only the installed
package on the path, `serving.app` and `scaleforge` import, and Ray's own `serve deploy` of
`configs/serve.yaml`, its artifacts in a bucket, serves it on a running cluster, through Serve's proxy
and, the cluster started with direct ingress on, at the ingress replica's own port."""

import os
import shutil
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
from serving_env import free_port, v2_body

from scaleforge.artifacts.parts import save_moe_parts
from scaleforge.artifacts.servable import load_servable
from scaleforge.cluster import LocalHead
from scaleforge.config import ServeConfig
from scaleforge.data import load_mnist1d
from scaleforge.deployment.deploy import direct_ingress_urls
from scaleforge.models import MLPSpec, MoESpec
from scaleforge.quickfit import fit_and_save, fit_classifier
from scaleforge.storage import join

pytestmark = pytest.mark.slow  # a Ray head of its own and Serve deployed to it (~40 s)

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
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache"),
    )
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


def _env(target: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    return {**env, "PYTHONPATH": str(target)}


def test_both_packages_import_from_the_install_and_nothing_else(installed, tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _ONLY_INSTALLED, str(installed)],
        cwd=tmp_path,
        env=_env(installed),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert [Path(p).relative_to(installed).parts[0] for p in out.stdout.split()] == ["scaleforge", "serving"]
    assert not (installed / "jobs").exists() and not (installed / "tests").exists()


def test_serve_deploy_serves_configs_serve_yaml_from_the_bucket_with_the_installed_package(
    installed, s3, tmp_path
):
    """``serve deploy`` of ``configs/serve.yaml`` (its artifacts in a bucket, two of its eight experts) to a
    running cluster whose Python has the installed package, from a folder that is not the repository.
    The cluster runs with ``RAY_SERVE_ENABLE_DIRECT_INGRESS=1``: the app's ingress replica also answers
    at a port of its own, found from the dashboard's Serve details, with the proxy's answers."""
    data = load_mnist1d(2000, 42, 0.2, "~/.cache/scaleforge")
    root = s3.uri("installed")
    artifacts = {
        name: str(fit_and_save(join(root, name), MLPSpec(hidden=[hidden]), data, epochs=1))
        for name, hidden in (("student", 16), ("teacher", 32))
    }
    moe = MoESpec(stem_channels=[8], d_model=16, num_experts=2, expert_hidden=16, top_k=2)
    parts = save_moe_parts(
        join(root, "moe"),
        fit_classifier(moe, data["x"], data["y"], epochs=1),
        moe,
        input_dim=40,
        num_classes=10,
        dataset={},
    )
    artifacts.update(
        {"moe-gate": parts["gate"], **{f"moe-expert-{i}": p for i, p in enumerate(parts["experts"])}}
    )
    config = yaml.safe_load((REPO / "configs" / "serve.yaml").read_text())
    port = free_port()
    config["http_options"]["port"] = port
    args = config["applications"][0]["args"]
    args["models"] = [
        {**m, "artifact": artifacts[m["name"]]} for m in args["models"] if m["name"] in artifacts
    ]
    next(r for r in args["routers"] if r["kind"] == "moe")["experts"] = ["moe-expert-0", "moe-expert-1"]
    ServeConfig.model_validate(config)
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))

    cache = tmp_path / "node-cache"
    environment = {
        "PYTHONPATH": str(installed),
        "SCALEFORGE_CACHE": str(cache),
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
    }
    with LocalHead(num_cpus=4, environment=environment) as head:
        env = head.env()
        deployed = subprocess.run(
            [
                str(Path(sys.executable).with_name("serve")),
                "deploy",
                "serve.yaml",
                "--address",
                head.dashboard_url,
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert deployed.returncode == 0, deployed.stdout[-2000:] + deployed.stderr[-2000:]
        x = data["x_test"][:8].astype(np.float32)
        answers = {
            name: _first_answer(f"http://127.0.0.1:{port}/v2/models/{name}/infer", v2_body(x))
            for name in ("teacher", "cascade", "moe")
        }
        replicas = args["ingress"]["replicas"]  # every ingress replica answers at a port of its own
        # The app answers once one replica runs; the others may still be starting (CI once listed 1 of 2).
        deadline = time.monotonic() + 120
        while True:
            details = httpx.get(
                f"{head.dashboard_url}/api/serve/applications/",
                timeout=30,
                headers={"Authorization": f"Bearer {head.token}"},
            )
            assert details.status_code == 200, details.text
            direct = direct_ingress_urls(details.json())
            if len(direct.get("scaleforge", [])) >= replicas or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert list(direct) == ["scaleforge"] and len(direct["scaleforge"]) == replicas, direct
        direct_url = direct["scaleforge"][0]
        assert direct_url.startswith("http://127.0.0.1:") and not direct_url.endswith(f":{port}"), direct_url
        directly = {
            name: httpx.post(f"{direct_url}/v2/models/{name}/infer", json=v2_body(x), timeout=60)
            for name in ("teacher", "cascade", "moe")
        }
    for name, response in answers.items():
        assert response is not None and response.status_code == 200, (name, response and response.text)
        assert (
            directly[name].status_code == 200
            and directly[name].json()["outputs"] == response.json()["outputs"]
        ), (name, directly[name].text)
    classes = next(o for o in answers["teacher"].json()["outputs"] if o["name"] == "class")
    with torch.inference_mode():
        expected = load_servable(artifacts["teacher"]).module(torch.from_numpy(x)).argmax(dim=-1)
    assert classes["shape"] == [8] and classes["data"] == expected.tolist()
    # The replicas read every model from the bucket through the node's cache (one file per distinct weights).
    assert len(list((cache / "artifacts").glob("*/model.safetensors"))) == len(artifacts)


def _first_answer(url: str, body: dict, timeout_s: float = 180):
    """The endpoint's first 200 (its last answer if none came), polled while Serve deploys the app:
    until then the proxy is not listening, or answers 404 (no such route yet) or 503."""
    deadline, response = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            response = httpx.post(url, json=body, timeout=30)
            if response.status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(1)
    return response
