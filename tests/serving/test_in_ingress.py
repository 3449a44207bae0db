"""A cascade whose stage 0 runs inside the ingress (``in_ingress``) answers exactly what the
two-model cascade computes, with no deployment of its own for that model."""

import httpx
import numpy as np
import pytest
import torch
from ray import serve
from serving_env import mnist1d, output, running_serve, small_deployment, trained_models, v2_body

from scaleforge.artifacts.servable import load_servable
from scaleforge.routing import escalate
from serving.app import build_app

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
