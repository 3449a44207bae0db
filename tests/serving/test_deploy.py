"""What `jobs.serve` and the main job's serve stage deploy: the config goes to Serve as `serve run`
sends it (each app's `runtime_env` applies), and a cluster too small for it is refused at once."""

import time

import httpx
import pytest
from ray import serve
from serving_env import free_port, running_serve, v2_body

from scaleforge.config import ServeConfig
from scaleforge.data import load_mnist1d
from scaleforge.deployment.deploy import AppCheckError, deploy
from scaleforge.models import MLPSpec
from scaleforge.quickfit import fit_and_save

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    data = load_mnist1d(2000, 42, 0.2, "~/.cache/scaleforge")
    return data, fit_and_save(tmp_path_factory.mktemp("tiny") / "tiny", MLPSpec(hidden=[16]), data, epochs=1)


def _config(artifact, port: int, num_cpus: float = 0.25, **app) -> ServeConfig:
    return ServeConfig.model_validate(
        {
            "proxy_location": "HeadOnly",
            "http_options": {"host": "127.0.0.1", "port": port},
            "applications": [
                {
                    "name": "deployed",
                    "args": {
                        "models": [{"name": "tiny", "artifact": str(artifact), "num_cpus": num_cpus}],
                        "ingress": {"num_cpus": 0.25},
                        **app.pop("args", {}),
                    },
                    **app,
                }
            ],
        }
    )


def test_a_cluster_too_small_for_the_config_is_refused_naming_the_shortfall(ray_cluster, tiny):
    _, artifact = tiny
    cfg = _config(artifact, free_port(), num_cpus=20)
    cfg.applications[0].args.models[0].replicas = 2
    began = time.monotonic()
    with pytest.raises(
        AppCheckError,
        match=r"ask for 40.25 CPUs \(replicas x num_cpus .*\) and the cluster has "
        r"[0-9.]+ free of 4",
    ):
        deploy(cfg)
    assert time.monotonic() - began < 30


def test_runtime_env_of_an_app_reaches_its_replicas(ray_cluster, tiny, monkeypatch):
    """`auth.token_env` names a variable that only the app's runtime_env sets: the replicas read it."""
    data, artifact = tiny
    monkeypatch.delenv("SF_DEPLOY_TOKEN", raising=False)
    port = running_serve()  # the session's Serve: deploy() adds the app to it, as to a cluster's
    cfg = _config(
        artifact,
        port,
        runtime_env={"env_vars": {"SF_DEPLOY_TOKEN": "from-runtime-env"}},
        args={"auth": {"token_env": "SF_DEPLOY_TOKEN"}},
    )
    try:
        assert deploy(cfg) == f"http://127.0.0.1:{port}"
        url, body = f"http://127.0.0.1:{port}/v2/models/tiny/infer", v2_body(data["x_test"][:4])
        assert httpx.post(url, json=body, timeout=30).status_code == 401
        assert (
            httpx.post(url, json=body, headers={"Authorization": "Bearer nope"}, timeout=30).status_code
            == 401
        )
        answer = httpx.post(url, json=body, headers={"Authorization": "Bearer from-runtime-env"}, timeout=30)
        assert answer.status_code == 200, answer.text
    finally:
        serve.delete("deployed")
