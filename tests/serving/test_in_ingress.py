"""A cascade whose stage 0 runs inside the ingress (``in_ingress``) answers exactly what the
two-model cascade computes, with no deployment of its own for that model."""

import asyncio

import httpx
import numpy as np
import pytest
import torch
from ray import serve
from serving_env import mnist1d, output, running_serve, small_deployment, trained_models, v2_body

from scaleforge.artifacts import save_artifact
from scaleforge.artifacts.servable import load_servable
from scaleforge.config.serve import ModelEntry
from scaleforge.models import MLPSpec, build_model
from scaleforge.routing import escalate
from serving.app import build_app
from serving.models import InIngressModel

pytestmark = pytest.mark.slow
APP = "sf-in-ingress"
THRESHOLD = 0.9


def test_a_cascade_with_stage_0_in_the_ingress_answers_as_the_two_models_do(ray_cluster, tmp_path_factory):
    models = trained_models(tmp_path_factory)
    args = {
        "models": [
            {"name": "student", "artifact": models["student"], "in_ingress": True},
            {"name": "teacher", "artifact": models["teacher"], **small_deployment()},
        ],
        "routers": [
            {
                "kind": "cascade",
                "name": "cascade",
                "stages": [{"model": "student", "threshold": THRESHOLD}, {"model": "teacher"}],
            }
        ],
        "ingress": small_deployment(max_ongoing_requests=64),
    }
    port = running_serve()
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    try:
        assert set(serve.status().applications[APP].deployments) == {"ingress", "model-teacher"}
        x = mnist1d()["x_test"][:256]
        answer = httpx.post(
            f"http://127.0.0.1:{port}/{APP}/v2/models/cascade/infer", json=v2_body(x, trace=True), timeout=60
        )
        assert answer.status_code == 200, answer.text
        direct = httpx.post(
            f"http://127.0.0.1:{port}/{APP}/v2/models/student/infer", json=v2_body(x), timeout=60
        )
        assert direct.status_code == 200, direct.text
    finally:
        serve.delete(APP)
    with torch.inference_mode():
        student, teacher = (
            load_servable(models[m]).module(torch.from_numpy(x)).softmax(1) for m in ("student", "teacher")
        )
    handed_on = escalate(student, THRESHOLD, "max_prob").numpy()
    expected = np.where(handed_on[:, None], teacher.numpy(), student.numpy())
    response = answer.json()
    np.testing.assert_allclose(output(response, "probabilities"), expected, atol=1e-5)
    np.testing.assert_array_equal(output(response, "stage"), handed_on.astype(np.int64))
    assert 0 < handed_on.sum() < len(x)  # both stages answered some inputs
    np.testing.assert_allclose(output(direct.json(), "probabilities"), student.numpy(), atol=1e-5)


def test_concurrent_calls_of_a_model_in_the_ingress_share_its_forward_passes(tmp_path):
    """The calls waiting when a pass starts share it (at most ``max_batch_size``), each gets its own rows'
    logits, and an error in the pass reaches every caller of it."""
    spec = MLPSpec(hidden=[8])
    artifact = save_artifact(tmp_path / "m", build_model(spec, 40, 10), spec, input_dim=40, num_classes=10)
    model = InIngressModel(
        ModelEntry(name="m", artifact=str(artifact), max_batch_size=3, batch_wait_timeout_s=0)
    )
    forward, passes = model.forward, []
    model.forward = lambda batches: passes.append(len(batches)) or forward(batches)
    xs = [np.random.default_rng(i).standard_normal((i + 1, 40)).astype(np.float32) for i in range(7)]

    async def calls():
        return await asyncio.gather(*(model.predict(x) for x in xs), return_exceptions=True)

    answers = asyncio.run(calls())
    assert passes == [3, 3, 1]
    with torch.inference_mode():
        for x, answer in zip(xs, answers):
            np.testing.assert_allclose(answer, forward.model.module(torch.from_numpy(x)).numpy(), atol=1e-6)
    model.forward = lambda batches: 1 / 0
    assert all(isinstance(a, ZeroDivisionError) for a in asyncio.run(calls()))
