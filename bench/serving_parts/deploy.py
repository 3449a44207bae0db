"""The Serve apps of bench/serving.py, each on its own route: teacher-only, the cascade (student in the
ingress, or as a deployment of its own), the bare stage-0 peer and the early-exit network (its
``early_exit`` router).

Every use of the serve config's shape (``build_app``'s models, routers and ingress) and of the
library's deployment code is in this file."""

from peers.serve_bare import BareModel
from ray import serve
from ray.serve.context import _get_global_client

from scaleforge.deployment.deploy import direct_ingress_urls
from serving.app import build_app
from serving_parts.common import MODEL_PROCESSES, THREADS


def deploy(paths: dict[str, str], thresholds: dict[str, float]) -> None:
    threshold = thresholds["cascade"]
    model = {"num_cpus": 0.1, "threads": THREADS, "max_ongoing_requests": 32, "max_queued_requests": -1}
    ingress = {"num_cpus": 0.1, "max_ongoing_requests": 64, "max_queued_requests": -1}
    teacher = {"name": "teacher", "artifact": paths["teacher"], **model}
    teacher_only = {"models": [{**teacher, "replicas": MODEL_PROCESSES}], "ingress": ingress}
    # The student runs in the ingress with no batching wait: a request of 64 rows is a batch already,
    # and requests that arrive while it runs are merged all the same.
    student = {"name": "student", "artifact": paths["student"], **model, "batch_wait_timeout_s": 0.0}
    cascade = {
        "models": [{**student, "in_ingress": True}, teacher],
        "routers": [
            {
                "kind": "cascade",
                "name": "cascade",
                "stages": [{"model": "student", "threshold": threshold}, {"model": "teacher"}],
            }
        ],
        "ingress": ingress,
    }
    separate = {**cascade, "models": [student, teacher]}
    # The early-exit network in the ingress (its router runs the network's exits), one ingress per
    # model process; the router is served as "early-exit", the name the load generator asks for.
    network = {"name": "network", "artifact": paths["early-exit"], **model, "batch_wait_timeout_s": 0.0}
    early_exit = {
        "models": [{**network, "in_ingress": True}],
        "routers": [
            {
                "kind": "early_exit",
                "name": "early-exit",
                "model": "network",
                "threshold": thresholds["early exit"],
            }
        ],
        "ingress": {**ingress, "replicas": MODEL_PROCESSES},
    }
    serve.run(build_app(teacher_only), name="teacher-only", route_prefix="/teacher-only")
    serve.run(build_app(cascade), name="cascade", route_prefix="/cascade")
    serve.run(build_app(separate), name="cascade-2-deployments", route_prefix="/cascade-2-deployments")
    serve.run(
        BareModel.options(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64).bind(
            paths["student"]
        ),
        name="bare",
        route_prefix="/bare",
    )
    serve.run(build_app(early_exit), name="early-exit", route_prefix="/early-exit")


def direct_urls() -> dict[str, list[str]]:
    """Each app's ingress replicas' own URLs (direct ingress), as Serve publishes them."""
    return direct_ingress_urls(_get_global_client().get_serve_details())
