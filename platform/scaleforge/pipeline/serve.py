"""The serve stage: the run's serve plan, each model placed for this cluster's hardware, written once
(``serve.yaml`` in the output folder) and deployed."""

import time
from pathlib import Path
from typing import Callable, Optional, Union

import httpx
import yaml

from scaleforge.cluster import free_ports
from scaleforge.config import ServeConfig, load_config
from scaleforge.config.serve import ServeArgs
from scaleforge.pipeline.base import PipelineStage, StageContext
from scaleforge.pipeline.records import LoadedFrom, Placement, ServeRecord
from scaleforge.pipeline.serve_plan import serve_args
from scaleforge.storage import join, write_atomic

READY_WITHIN_S = 60.0
"""How long a recorded endpoint that answers 503 on its ready route is asked again before it is redeployed."""


class ServeStage(PipelineStage):
    """Serve runs until the pipeline ends (the query stage needs it), then :meth:`close` deletes its apps;
    a run that stops here (``--to serve``) leaves them running for a later ``--from query``."""

    name = "serve"
    record = ServeRecord
    outlives_run = True

    def __init__(self) -> None:
        self._apps: list[str] = []
        self._replacing: list[str] = []
        """The apps this run deploys (an earlier run's of the same names are replaced)."""

    @classmethod
    def stale(cls, record: ServeRecord) -> Optional[str]:
        """A recorded endpoint is reused only while it answers ready (apps are deleted when a run ends).

        A 503 is asked again for up to ``READY_WITHIN_S``: the ingress gives each model's ready call 2 s,
        which a running app missed on a loaded machine, and redeploying it costs minutes."""
        deadline = time.monotonic() + READY_WITHIN_S
        while True:
            try:
                answer = httpx.get(f"{record.url}/v2/health/ready", timeout=5)
            except httpx.HTTPError as err:
                return f"{record.url} does not answer ({type(err).__name__})"
            if answer.status_code == 200:
                return None
            if answer.status_code != 503 or time.monotonic() > deadline:
                return f"{record.url}/v2/health/ready answers {answer.status_code}"
            time.sleep(1.0)

    def run(self, ctx: StageContext) -> ServeRecord:
        from scaleforge.deployment.deploy import deploy, ingress_replica_urls

        spec = ctx.cfg.serve
        template = load_config(ServeConfig, spec.config, spec.set)
        app = template.applications[0]
        self._replacing = [a.name for a in template.applications]
        args, placement = self.plan(ctx, app.args)
        cfg = template.model_copy(
            update={
                "http_options": template.http_options.model_copy(update={"port": free_ports(1)[0]}),
                "applications": [app.model_copy(update={"args": args}), *template.applications[1:]],
            }
        )
        written = write_serve_yaml(
            join(ctx.out, "serve.yaml"),
            cfg,
            f"# ray serve config written by jobs.pipeline's serve stage from {spec.config}: this run's "
            "artifacts,\n# the calibrated thresholds, each model placed for this cluster\n",
        )
        self._apps = [a.name for a in cfg.applications]  # a deploy that fails half way has started some
        url = deploy(cfg)
        return ServeRecord(
            url=url,
            placement=placement,
            serve_config=str(written),
            loaded_from=_loaded_from(app.name, args),
            direct_urls=ingress_replica_urls().get(app.name, []),
        )

    def plan(self, ctx: StageContext, template: ServeArgs) -> tuple[ServeArgs, Placement]:
        """``template`` (``serve.config``'s app args) serving this run's artifacts, each model placed."""
        return _place(ctx, serve_args(template, ctx.cfg.serve, ctx.records), self._replacing)

    def close(self) -> None:
        """Delete this run's applications (other apps on a shared cluster, and Serve itself, stay)."""
        from ray import serve

        for name in self._apps:
            serve.delete(name)


def _loaded_from(app: str, args: ServeArgs) -> dict[str, LoadedFrom]:
    """Ask a replica of each model deployment what it loaded and where it runs."""
    return {
        model.name: LoadedFrom.model_validate(_ask(model.deployment_name, app, "loaded_from"))
        for model in args.models
        if not model.in_ingress
    }


def _ask(deployment: str, app: str, method: str):
    """One call to a replica of ``deployment`` through a handle that is shut down afterwards.

    A handle's router records its metrics from a thread of its own every 100 ms, for as long as the
    process lives; a report that lands after ``ray.shutdown`` (at the driver's exit) calls into
    Ray's torn-down metrics code: ``jobs.pipeline --to serve`` once crashed so (exit code 139), its
    work done."""
    from ray import serve

    call = getattr(serve.get_deployment_handle(deployment, app_name=app), method)
    try:
        return call.remote().result(timeout_s=60)
    finally:
        call.shutdown()


def _place(ctx: StageContext, args: ServeArgs, replacing: list[str]) -> tuple[ServeArgs, Placement]:
    """Measure the cluster (or read ``placement.hwbench``) and place the app's models by it; running
    apps named in ``replacing`` are deleted before a measurement."""
    from scaleforge.deployment.hardware import measure_cluster, read_reports
    from scaleforge.deployment.placement import ClusterHardware, place_models

    spec = ctx.cfg.placement
    if not spec.enabled:
        return args, Placement(enabled=False)
    if spec.hwbench:
        reports = read_reports(spec.hwbench)
    else:
        _delete_running(replacing, ctx.log)
        reports = measure_cluster(cpu_size=256, gpu_size=2048, repeats=2, timeout_s=120)
    hardware = ClusterHardware.from_reports(reports)
    args, where = place_models(
        args, hardware, gpu_share=spec.gpu_share, gpu_min_parameters=spec.gpu_min_parameters
    )
    ctx.log(
        f"[pipeline] placement: {len(hardware.cpu_nodes)} CPU-only node(s), {len(hardware.gpu_nodes)} "
        f"GPU node(s); " + ", ".join(f"{name}->{kind}" for name, kind in where.items())
    )
    return args, Placement(
        enabled=True,
        cpu_nodes=len(hardware.cpu_nodes),
        gpu_nodes=len(hardware.gpu_nodes),
        models=where,
        devices=reports,
    )


def _delete_running(names: list[str], log: Callable[[str], None]) -> None:
    """Delete those of ``names`` that are running (an earlier run's apps, left up by ``--to serve``)
    before the cluster is measured: their replicas hold CPUs and GPUs the measurement needs, and this
    run's deploy replaces them anyway."""
    from ray import serve

    apps = serve.status().applications
    running = [name for name in names if name in apps]
    if running:
        log(f"[pipeline] serve: deleting {', '.join(running)} (an earlier run's) to measure the cluster")
        for name in running:
            serve.delete(name)


def write_serve_yaml(path: str, cfg: ServeConfig, header: str) -> Union[Path, str]:
    """The fields that were set (the file reads like the one it came from), validated again first:
    ``model_copy(update=...)`` runs no validators."""
    fields = cfg.model_dump(mode="json", exclude_unset=True)
    ServeConfig.model_validate(fields)
    return write_atomic(path, header + yaml.safe_dump(fields, sort_keys=False))
