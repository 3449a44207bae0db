"""Deploy a validated Serve config (``configs/serve.yaml``): check every app, then start Serve and run
each app.

What ``python -m jobs.serve`` and the main job's serve stage do. Every app's artifacts and shapes
are checked from their manifests before Ray starts (:func:`check_applications`). An embedded Ray
is sized to the CPUs the config asks for; on an existing cluster a shortfall fails at once, naming
it. The config then goes to Serve's controller exactly as ``serve run config.yaml`` sends it
(``deploy_apps``), so each app's ``runtime_env`` applies to its build and its replicas. The app
modules themselves (``serving/``) are never imported by name here.
"""

import math
import os
import signal
import time

import httpx
import ray
from ray import serve
from ray.serve._private import api as serve_api  # what `serve run config.yaml` calls (Ray 2.60)
from ray.serve.context import _get_global_client
from ray.serve.schema import ApplicationStatus, ServeDeploySchema

from scaleforge.artifacts import ArtifactError
from scaleforge.config.cli import import_object
from scaleforge.config.loader import ConfigError
from scaleforge.config.serve import ServeConfig
from scaleforge.runtime import ensure_ray, joins_a_cluster, quiet_ray_loggers
from scaleforge.serving_contract import model_infos


class AppCheckError(ConfigError):
    """An application cannot be served: an artifact is missing or malformed, or its models' shapes
    disagree."""


def check_applications(cfg: ServeConfig) -> None:
    """Every app's artifacts and shapes, and that its ``import_path`` imports; no Ray resource is
    touched (a router's runtime class is its entry's ``router``, imported with the config).

    Raises:
        AppCheckError: one line naming the application and the problem.
    """
    for app in cfg.applications:
        try:
            model_infos(app.args)
            import_object(app.import_path)
        except (ArtifactError, ImportError, ValueError) as err:
            raise AppCheckError(f"application {app.name!r}: {err}") from None


def deploy(cfg: ServeConfig, ready_within_s: float = 300) -> str:
    """Check every app (before Ray starts), make sure the cluster has the CPUs they ask for, then
    deploy the config as ``serve run`` does and wait until every app is running.

    Returns:
        The base URL of the HTTP proxy (of the Serve already running on the cluster, if one is: Serve
        keeps its proxy's host and port until it is shut down).

    Raises:
        AppCheckError: an app cannot be served, or the cluster lacks the CPUs (before deploying).
        RuntimeError: an app failed to deploy or was not running within ``ready_within_s`` (Serve's message).
    """
    check_applications(cfg)
    asked = sum(app.args.cpus_asked for app in cfg.applications)
    ensure_ray(min_cpus=max(4, math.ceil(asked)))
    quiet_ray_loggers()  # importing ray.serve set its logger to INFO ("Started Serve ..." on the console)
    free = ray.available_resources().get("CPU", 0.0)
    if asked > free + 1e-9:
        raise AppCheckError(
            f"the applications ask for {asked:g} CPUs (replicas x num_cpus of every model and "
            f"ingress) and the cluster has {free:g} free of {ray.cluster_resources().get('CPU', 0):g}"
        )
    began = time.monotonic()
    client = _start_serve(cfg)
    client.deploy_apps(ServeDeploySchema.model_validate(cfg.model_dump(mode="json", exclude_none=True)))
    _wait_until_running([app.name for app in cfg.applications], ready_within_s)
    url = f"http://{client.http_config.host}:{client.http_config.port}"
    _wait_until_answering(url, ready_within_s - (time.monotonic() - began))
    return url


def _start_serve(cfg: ServeConfig, attempts: int = 3):
    """Start Serve (or join the one running) as ``serve run`` does. On a loaded node a proxy may miss
    its ready check (5 s) while it starts, and Serve kills it and starts another: the start raises
    then, and is repeated (the restarted proxy is waited for by :func:`_wait_until_answering`)."""
    asked = cfg.http_options.model_dump(exclude_none=True)
    for attempt in range(attempts):
        try:
            client = serve_api.serve_start(
                proxy_location=cfg.proxy_location,
                http_options=asked,
                grpc_options=cfg.grpc_options and cfg.grpc_options.model_dump(),
            )
            break
        except ray.exceptions.RayActorError:
            if attempt == attempts - 1:
                raise
    running = client.http_config  # Ray's own warning when these differ stays off the console (runtime._QUIET)
    differs = [
        f"{key} {value} (it uses {getattr(running, key)})"
        for key, value in asked.items()
        if key in ("host", "port") and getattr(running, key) != value
    ]
    if differs:
        print(
            f"[serve] Serve already runs on this cluster: http_options {', '.join(differs)} apply only when "
            "it starts anew (serve shutdown)",
            flush=True,
        )
    return client


def _wait_until_answering(url: str, within_s: float) -> None:
    """Until the HTTP proxy at ``url`` answers its health route (it may still be starting)."""
    deadline = time.monotonic() + max(within_s, 10.0)
    while True:
        try:
            if httpx.get(f"{url}/-/healthz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"Serve's HTTP proxy at {url} did not answer /-/healthz within {within_s:.0f} s"
            )
        time.sleep(0.5)


def _wait_until_running(names: list[str], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while True:
        apps = serve.status().applications
        states = {
            name: apps[name].status if name in apps else ApplicationStatus.NOT_STARTED for name in names
        }
        failed = [
            name
            for name, state in states.items()
            if state in (ApplicationStatus.DEPLOY_FAILED, ApplicationStatus.UNHEALTHY)
        ]
        if failed:
            raise RuntimeError("; ".join(f"application {name!r}: {apps[name].message}" for name in failed))
        if all(state == ApplicationStatus.RUNNING for state in states.values()):
            return
        if time.monotonic() > deadline:
            waiting = {
                name: apps[name].message if name in apps else "not started"
                for name, state in states.items()
                if state != ApplicationStatus.RUNNING
            }
            raise RuntimeError(f"not running within {within_s:.0f} s: {waiting}")
        time.sleep(0.5)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def serve_until_interrupted(cfg: ServeConfig) -> str:
    """:func:`deploy`, then keep serving until Ctrl-C or SIGTERM (``kill``, ``docker stop``), then stop.

    On a cluster (``RAY_ADDRESS``) stopping shuts Serve down there, as ``serve run`` does. An embedded
    Ray goes away with this process and takes every replica with it: waiting for Serve's graceful
    shutdown first would only add seconds (and Ray's complaint that its controller was killed).
    A process started with SIGINT ignored (``cmd &`` in a script) still stops on SIGTERM.

    Returns:
        The base URL that was served.
    """
    url = deploy(cfg)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    print(f"serving {', '.join(a.name for a in cfg.applications)} at {url}/v2 (Ctrl-C stops)", flush=True)
    for app, direct in ingress_replica_urls().items():
        print(f"  {app} also directly at {', '.join(f'{u}/v2' for u in direct)} (direct ingress)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, previous)
        if joins_a_cluster():
            print("stopping: shutting Serve down on the cluster", flush=True)
            serve.shutdown()
        else:
            ray.shutdown()
    return url


def direct_ingress_urls(details: dict) -> dict[str, list[str]]:
    """Each app's ingress replicas' own HTTP URLs, where Serve runs with direct ingress.

    With ``RAY_SERVE_ENABLE_DIRECT_INGRESS=1`` in the cluster's environment (Ray 2.60), every ingress
    replica also serves HTTP on a port of its own (30000 and up, on ``http_options.host``), so a
    client or a load balancer reaches it without the proxy's hop (``bench/serving.py`` measures
    both). ``details`` is Serve's instance details (``GET /api/serve/applications/`` on the
    dashboard, or the Serve client's ``get_serve_details()``); without direct ingress: ``{}``.
    """
    host = (details.get("http_options") or {}).get("host") or "127.0.0.1"
    urls: dict[str, list[str]] = {}
    for group in details.get("target_groups") or []:
        if group.get("ingress_deployment_name") and str(group.get("protocol")).endswith("HTTP"):
            prefix = "" if group["route_prefix"] == "/" else group["route_prefix"]
            urls[group["app_name"]] = [
                f"http://{target['ip'] if host in ('0.0.0.0', '::') else host}:{target['port']}{prefix}"
                for target in group["targets"]
            ]
    return urls


def ingress_replica_urls() -> dict[str, list[str]]:
    """:func:`direct_ingress_urls` of the Serve this process deployed to, with or without HAProxy in
    front of the replicas (``scaleforge.runtime.SERVE_HAPROXY``): Serve's details then list HAProxy, so
    the targets are those Serve's controller gives HAProxy's manager."""
    client = _get_global_client()
    groups = ray.get(client._controller.get_target_groups.remote(from_proxy_manager=True))
    groups = [group.model_dump(mode="json") for group in groups]
    return direct_ingress_urls({**client.get_serve_details(), "target_groups": groups})


def python_proxy_url() -> str:
    """Serve's Python proxy of an embedded Ray where HAProxy holds Serve's HTTP port (HAProxy's
    fallback, on the port ``scaleforge.runtime`` picked for it), else ``""``."""
    if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
        return ""
    host = _get_global_client().get_serve_details()["http_options"]["host"]
    return f"http://{host}:{os.environ['RAY_SERVE_FALLBACK_PROXY_HTTP_PORT']}"
