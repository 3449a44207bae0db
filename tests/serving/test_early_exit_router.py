"""The early-exit network served as a cascade of its own exits (router kind ``early_exit``): over real
HTTP it answers as the network's own ``predict`` does, the rest of the network runs only for the rows
the side exit hands on, and a model whose family has one exit is refused before anything is deployed."""

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from pydantic import ValidationError
from ray import serve
from serving_env import mnist1d, output, running_serve, small_deployment, v2_body

from scaleforge.artifacts import save_artifact
from scaleforge.artifacts.servable import load_servable
from scaleforge.config.serve import ServeArgs
from scaleforge.models import CNN1dEarlyExitSpec, CNN1dSpec, build_model
from scaleforge.models.early_exit import joint_loss
from scaleforge.quickfit import fit
from scaleforge.serving_contract import model_infos
from serving.app import build_app
from serving.metrics import RoutingMetrics
from serving.models import InIngressModel
from serving.routers import ServedModels, build_router

SPEC = CNN1dEarlyExitSpec(channels=[8, 16], hidden=32, exit_after=1, exit_hidden=32)


@pytest.fixture(scope="module")
def network(tmp_path_factory) -> str:
    """A small early-exit network trained for seconds with both exits' loss, saved as an artifact."""
    data = mnist1d()
    torch.manual_seed(0)
    model = build_model(SPEC, 40, 10)
    fit(model, data["x"][:6000], data["y"][:6000], epochs=2, batch_size=128, lr=3e-3, loss=joint_loss)
    folder = tmp_path_factory.mktemp("early-exit") / "network"
    return str(save_artifact(folder, model.eval(), SPEC, input_dim=40, num_classes=10))


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return mnist1d()["x_test"][:256].astype(np.float32)


@pytest.fixture(scope="module")
def mid_threshold(network, x) -> float:
    """Halfway between two neighbouring side-exit confidences near the median: about half the rows go
    on, and no row sits on the threshold (where rounding could decide its exit)."""
    with torch.inference_mode():
        side = load_servable(network).module.exit_logits(torch.from_numpy(x))[0].softmax(dim=-1)
    confidences = np.sort(side.max(dim=-1).values.numpy())
    middle = len(confidences) // 2
    return float(confidences[middle - 1] + confidences[middle]) / 2


def _args(artifact: str, routers: list[dict], in_ingress: bool = True) -> dict:
    return {
        "models": [{"name": "net", "artifact": artifact, "in_ingress": in_ingress}],
        "routers": routers,
        "ingress": small_deployment(max_ongoing_requests=16),
    }


def _router(name: str, threshold: float) -> dict:
    return {"kind": "early_exit", "name": name, "model": "net", "threshold": threshold}


def test_served_over_http_it_answers_as_the_networks_own_predict(ray_cluster, network, x, mid_threshold):
    routers = [_router("exits", mid_threshold), _router("side-only", 0.0), _router("final-only", 1.01)]
    port, app = running_serve(), "sf-early-exit"
    serve.run(build_app(_args(network, routers)), name=app, route_prefix=f"/{app}")
    try:
        base = f"http://127.0.0.1:{port}/{app}/v2/models"
        answers = {
            name: httpx.post(f"{base}/{name}/infer", json=v2_body(x, trace=True), timeout=60)
            for name in ("exits", "side-only", "final-only", "net")
        }
        overridden = httpx.post(
            f"{base}/exits/infer", json=v2_body(x, trace=True, min_confidence=0.0), timeout=60
        )
        metadata = httpx.get(f"{base}/exits", timeout=60).json()
    finally:
        serve.delete(app)
    for answer in [*answers.values(), overridden]:
        assert answer.status_code == 200, answer.text
    answers = {name: answer.json() for name, answer in answers.items()}
    offline = load_servable(network).module.predict(torch.from_numpy(x), mid_threshold)
    exits = output(answers["exits"], "exit")
    np.testing.assert_array_equal(exits, offline.stage.numpy())
    np.testing.assert_array_equal(output(answers["exits"], "class"), offline.predictions.numpy())
    np.testing.assert_allclose(output(answers["exits"], "probabilities"), offline.probs.numpy(), atol=1e-6)
    np.testing.assert_allclose(output(answers["exits"], "confidence"), offline.confidence.numpy(), atol=1e-6)
    assert 0 < exits.sum() < len(x)  # both exits answer at the mid threshold
    assert answers["exits"]["parameters"] == {
        "answered_at_side_exit": int((exits == 0).sum()),
        "escalated": int(exits.sum()),
    }
    assert (output(answers["side-only"], "exit") == 0).all()
    assert (output(overridden.json(), "exit") == 0).all()
    assert (output(answers["final-only"], "exit") == 1).all()
    # Everything at the final exit is the network as a plain classifier (its forward is the final exit).
    np.testing.assert_allclose(
        output(answers["final-only"], "probabilities"), output(answers["net"], "probabilities"), atol=1e-6
    )
    assert {"name": "exit", "datatype": "INT64", "shape": [-1]} in metadata["outputs"]


def test_only_the_rows_the_side_exit_hands_on_run_the_rest_of_the_network(
    ray_cluster, network, x, mid_threshold
):
    args = ServeArgs.model_validate(_args(network, [_router("exits", mid_threshold)]))
    served = ServedModels({}, {"net": InIngressModel(args.model("net"))}, model_infos(args))
    router = build_router(args.router("exits"), served, RoutingMetrics())
    rows_through_rest = []
    router.network.rest.register_forward_hook(
        lambda module, inputs, out: rows_through_rest.append(len(inputs[0]))
    )
    # Two requests merged into one pass, as the router's batching hands them over (Serve's batching
    # itself runs only inside a replica: the HTTP test above goes through it).
    (probs, exits, _), (_, more_exits, _) = router.run([(x, mid_threshold), (x[:10], mid_threshold)])
    assert rows_through_rest == [int(exits.sum() + more_exits.sum())]
    assert 0 < exits.sum() < len(x)
    np.testing.assert_array_equal(more_exits, exits[:10])
    assert probs.shape == (len(x), 10)


def _single_exit_network(folder: Path) -> str:
    spec = CNN1dSpec(channels=[8, 16], hidden=32)
    return str(save_artifact(folder, build_model(spec, 40, 10).eval(), spec, input_dim=40, num_classes=10))


def test_a_model_whose_family_has_one_exit_is_refused_before_deploying(tmp_path):
    args = _args(_single_exit_network(tmp_path / "cnn"), [_router("exits", 0.5)])
    with pytest.raises(ValueError, match="model 'net' is a cnn1d network with 1 exit; an early-exit router"):
        build_app(args)


@pytest.mark.parametrize(
    "in_ingress,routers,message",
    [
        (True, [_router("exits", 0.5) | {"model": "ghost"}], "early_exit 'exits' names models that are not"),
        (False, [_router("exits", 0.5)], "early_exit 'exits': model 'net' needs in_ingress: true"),
        (True, [_router("exits", -0.1)], "threshold"),
    ],
)
def test_a_config_it_cannot_serve_is_refused_naming_the_field(tmp_path, in_ingress, routers, message):
    with pytest.raises(ValidationError, match=message):
        ServeArgs.model_validate(_args("unused", routers, in_ingress))
