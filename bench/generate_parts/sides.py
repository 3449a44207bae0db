"""Each side's server for bench/generate.py, started and stopped around its measurements."""

import contextlib

import ray
from serving_parts.plain import free_port, uvicorn_server

from scaleforge.deployment.deploy import deploy, ingress_replica_urls


@contextlib.contextmanager
def our_server(paths: dict[str, str]):
    """configs/serve_lm.yaml's generator ``lm`` deployed on an embedded Ray as ``jobs.serve`` deploys it;
    yields (the proxy's URL, the ingress replicas' own URLs). Ray is shut down on leaving."""
    from generate_parts.setup import ours

    cfg, _ = ours(paths, free_port())
    try:
        proxy = deploy(cfg)
        yield proxy, ingress_replica_urls()[cfg.applications[0].name]
    finally:
        ray.shutdown()


@contextlib.contextmanager
def peer_server(exports: dict[str, str], workers: int = 2):
    """bench/peers/hf_generate.py under uvicorn: the exported teacher, the exported student as the
    assistant; yields its URL."""
    env = {"HF_MODEL": exports["teacher"], "HF_ASSISTANT": exports["student"]}
    with uvicorn_server("hf_generate:app", env, workers, "/health") as base:
        yield base
