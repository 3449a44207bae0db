"""Our side of bench/serving.py: the shipped serve config (``configs/serve.yaml``, the template that
``make demo``'s serve stage fills) serving the bench's models, deployed as ``jobs.serve`` deploys it,
and the bare stage-0 Serve deployment beside it.

Every use of the serve config and of the library's deployment code is in this file."""

import contextlib
from pathlib import Path

import ray
from peers.serve_bare import BareModel
from ray import serve

from scaleforge.config.loader import load_config
from scaleforge.config.serve import ServeConfig
from scaleforge.deployment.deploy import deploy, ingress_replica_urls
from scaleforge.routers import CascadeEntry
from serving_parts.plain import free_port

SERVED = ("student", "teacher")


def shipped(path: Path, paths: dict[str, str], threshold: float) -> ServeConfig:
    """The serve config at ``path`` serving the bench's student and teacher and its cascade at the
    calibrated ``threshold``, as the demo's serve stage fills the template (its MoE models and router,
    which the bench does not train, left out), on a free port; every deployment setting as shipped."""
    cfg = load_config(ServeConfig, path)
    app = cfg.applications[0]
    cascade = app.args.routers_of(CascadeEntry)[0]
    if cascade.models() != list(SERVED):
        raise ValueError(
            f"{path}: the bench serves a cascade of {SERVED}, the config's is {cascade.models()}"
        )
    stages = [{"model": "student", "threshold": threshold}, {"model": "teacher"}]
    args = app.args.model_copy(
        update={
            "models": [app.args.model(name).model_copy(update={"artifact": paths[name]}) for name in SERVED],
            "routers": [CascadeEntry.model_validate({**cascade.model_dump(), "stages": stages})],
        }
    )
    return cfg.model_copy(
        update={
            "http_options": cfg.http_options.model_copy(update={"port": free_port()}),
            "applications": [app.model_copy(update={"args": args})],
        }
    )


@contextlib.contextmanager
def served(cfg: ServeConfig, stage0_artifact: str):
    """``cfg`` deployed on an embedded Ray as ``jobs.serve`` deploys it (with its defaults: direct
    ingress on), and the bare stage-0 app on the same proxy at ``/bare``; yields (the proxy's base URL,
    the shipped app's ingress replicas' own URLs). Ray is shut down on leaving."""
    try:
        proxy = deploy(cfg)
        serve.run(
            BareModel.options(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64).bind(
                stage0_artifact
            ),
            name="bare",
            route_prefix="/bare",
        )
        direct = ingress_replica_urls()[cfg.applications[0].name]
        yield proxy, direct
    finally:
        ray.shutdown()  # the local cluster and Serve with it


def workers_for(args) -> tuple[int, str]:
    """The model processes of the served cascade (the plain server gets one worker per process), and
    its shape in words."""
    inside = [m.name for m in args.models if m.in_ingress]
    separate = {m.name: m.autoscaling.max_replicas if m.autoscaling else m.replicas for m in args.models}
    separate = {name: n for name, n in separate.items() if name not in inside}
    ingress = args.ingress.autoscaling.max_replicas if args.ingress.autoscaling else args.ingress.replicas
    processes = (ingress if inside else 0) + sum(separate.values())
    shape = f"{ingress} ingress replica(s)" + (f" each running {' + '.join(inside)}" if inside else "")
    shape += "".join(f", {name} {n} replica(s) (at most)" for name, n in separate.items())
    return max(processes, 1), shape
