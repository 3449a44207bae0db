"""KubeRay manifests (``ray.io/v1``) from the project's own files: a ``RayJob`` per job config, a
``RayService`` per serve config, a ``RayCluster`` from ``cluster.yaml``.

    python -m scaleforge.cluster kuberay job --config configs/train_dp.yaml --image IMG --storage s3://B/sf
    python -m scaleforge.cluster kuberay service --config configs/serve.yaml --image IMG --storage s3://B/sf
    python -m scaleforge.cluster kuberay cluster cluster.yaml --image IMG

The code travels in the image (the project installed at :data:`APP_DIR`, ``configs/`` with it): a
RayJob's submitter pod cannot upload a local working directory, and pods built from one image start
without installing anything. Pods share no disk, so every path a job or app reads or writes must be
in object storage (``--storage``); a local one is refused naming its field. Token authentication stays
on (``authOptions.mode: token``). Every manifest is checked (``scaleforge.cluster.kuberay_check``)
before it is returned.
"""

import math
import re
import shlex
from importlib.metadata import version
from pathlib import Path
from typing import Any, Optional

import yaml

from scaleforge.cluster.config import load_cluster_config
from scaleforge.cluster.kuberay_check import ManifestError, check_manifest, local_paths
from scaleforge.cluster.kuberay_pods import APP_DIR, GIB_PER_CPU, pod, tpu_group, worker_group
from scaleforge.config import JOB_SCHEMAS, load_config
from scaleforge.config.loader import job_of
from scaleforge.storage import is_uri

API = "ray.io/v1"
HEAD_POD = {"cpu": 2, "memory_gib": 8}
"""The head runs drivers, Ray Train's controller and Serve's controller and proxy, never a worker
(``num-cpus: 0``)."""
SERVE_POD_CPUS = 4


def resource_name(stem: str, kind: str) -> str:
    """``scaleforge-<stem>`` as a DNS-1035 label short enough for ``kind`` (see ``kuberay_check``)."""
    stem = stem if stem.lower().startswith("scaleforge") else f"scaleforge-{stem}"
    name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")
    return name[: 53 if kind == "RayCluster" else 47].rstrip("-")


def job_manifest(
    config: str, image: str, storage: str, overrides: tuple[str, ...] = (), deadline_s: int = 86400
) -> dict:
    """A ``RayJob`` running ``config``'s job (its opening ``# python -m jobs.<name>`` line) on a cluster
    of its own, sized from the config, deleted when the job ends."""
    job = job_of(Path(config))
    if job == "jobs.serve":
        raise ManifestError(f"{config} is a serve config: generate a RayService (kuberay service)")
    _require_uri(storage)
    rooted = "storage" in JOB_SCHEMAS[job].model_fields  # else its paths are given one by one (--set)
    sets = ((f"storage={storage}",) if rooted else ()) + tuple(overrides)
    cfg = load_config(JOB_SCHEMAS[job], config, list(sets))
    _refuse_local(cfg.model_dump(mode="json"), config)
    workers, cpu, gpu, memory = _workers(cfg)
    command = ["python", "-m", job, "--config", f"{APP_DIR}/configs/{Path(config).name}"]
    command += [f"--set={item}" for item in sets]
    elastic = getattr(getattr(cfg, "scaling", None), "min_workers", None)
    group = worker_group("workers", image, cpu, gpu, memory, elastic or workers, workers, workers)
    manifest = {
        "apiVersion": API,
        "kind": "RayJob",
        "metadata": {"name": resource_name(Path(config).stem, "RayJob")},
        "spec": {
            "entrypoint": shlex.join(command),
            "runtimeEnvYAML": yaml.safe_dump({"env_vars": {"PYTHONUNBUFFERED": "1"}}),
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "activeDeadlineSeconds": deadline_s,
            "backoffLimit": 0,  # Ray Train retries failed workers itself (run.max_failures)
            "rayClusterSpec": _cluster_spec(image, [group], autoscale=elastic is not None),
        },
    }
    return check_manifest(manifest)


def service_manifest(config: str, image: str, storage: str) -> dict:
    """A ``RayService`` whose ``serveConfigV2`` is ``config`` (a Ray Serve deploy file) with every
    artifact under ``storage``; its workers autoscale up to the deployments' largest replica counts."""
    from ray.serve.schema import ServeDeploySchema

    _require_uri(storage)
    serve = yaml.safe_load(Path(config).read_text())
    serve.pop("http_options", None)  # the operator owns the proxy's host and port (its serve Service)
    cpus = 0.0
    for app in serve["applications"]:
        for model in app.get("args", {}).get("models", []):
            model["artifact"] = _under(model["artifact"], storage)
            replicas = (model.get("autoscaling") or {}).get("max_replicas", 1)
            cpus += model.get("num_cpus", 1) * replicas
    _refuse_local({"applications": serve["applications"]}, config)
    ServeDeploySchema.model_validate(serve)
    most = max(1, math.ceil((cpus + 1) / SERVE_POD_CPUS))  # + the ingress's replica
    group = worker_group("serve", image, SERVE_POD_CPUS, 0, SERVE_POD_CPUS * GIB_PER_CPU * 2**30, 1, most, 1)
    manifest = {
        "apiVersion": API,
        "kind": "RayService",
        "metadata": {"name": resource_name(Path(config).stem, "RayService")},
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve, sort_keys=False),
            "upgradeStrategy": {"type": "NewCluster"},
            "rayClusterConfig": _cluster_spec(image, [group], autoscale=True),
        },
    }
    return check_manifest(manifest)


def cluster_manifest(cluster_yaml: str, image: str, tpu: Optional[str] = None) -> dict:
    """A ``RayCluster`` with ``cluster_yaml``'s node types as worker groups (min/max workers, CPUs,
    GPUs), its idle timeout, and the in-tree autoscaler (v2); with ``tpu`` (``ACCELERATOR:TOPOLOGY
    [:MAX_SLICES]``, GKE's names, e.g. ``tpu-v5-lite-podslice:4x4``) a TPU worker group too."""
    launcher = load_cluster_config(cluster_yaml)
    head_type = launcher["head_node_type"]
    groups = []
    for name, node in launcher["available_node_types"].items():
        if name == head_type:
            continue
        resources = node.get("resources", {})
        cpu, gpu = int(resources.get("CPU", 1)), int(resources.get("GPU", 0))
        low, high = node.get("min_workers", 0), node.get("max_workers", launcher.get("max_workers", 1))
        groups.append(
            worker_group(name.replace("_", "-"), image, cpu, gpu, cpu * GIB_PER_CPU * 2**30, low, high, low)
        )
    if tpu:
        groups.append(tpu_group(tpu, image))
    spec = _cluster_spec(image, groups, autoscale=True)
    spec["autoscalerOptions"]["idleTimeoutSeconds"] = int(launcher.get("idle_timeout_minutes", 5) * 60)
    manifest = {
        "apiVersion": API,
        "kind": "RayCluster",
        "metadata": {
            "name": resource_name(launcher.get("cluster_name", Path(cluster_yaml).stem), "RayCluster")
        },
        "spec": spec,
    }
    return check_manifest(manifest)


def _cluster_spec(image: str, groups: list[dict], autoscale: bool) -> dict:
    head = pod("ray-head", image, HEAD_POD["cpu"], 0, HEAD_POD["memory_gib"] * 2**30, autoscale)
    spec: dict[str, Any] = {
        "rayVersion": version("ray"),
        "authOptions": {"mode": "token"},
        "headGroupSpec": {"rayStartParams": {"num-cpus": "0"}, "template": head},
        "workerGroupSpecs": groups,
    }
    if autoscale:
        spec["enableInTreeAutoscaling"] = True
        spec["autoscalerOptions"] = {"version": "v2", "upscalingMode": "Default"}
    return spec


def _workers(cfg) -> tuple[int, float, int, int]:
    """Pods the job's workers need: (count, CPUs, GPUs, memory bytes each), from ``cfg.scaling``
    (Ray Train jobs) or ``cfg.num_workers`` (the parameter server's), else one worker of 2 CPUs."""
    scaling = getattr(cfg, "scaling", None)
    if scaling is not None and hasattr(scaling, "resources_per_worker"):
        per = scaling.resources_per_worker
        gpu = int(per.get("GPU", 1)) if scaling.use_gpu else 0
        cpu = max(1.0, per.get("CPU", 1))
        memory = int(per.get("memory", cpu * GIB_PER_CPU * 2**30))
        return scaling.num_workers, cpu, gpu, memory
    count = getattr(cfg, "num_workers", None) or 1
    return count, 2, 0, 2 * GIB_PER_CPU * 2**30


def _require_uri(storage: str) -> None:
    if not is_uri(storage):
        raise ManifestError(
            f"--storage {storage}: pods share no disk; give a bucket URI (s3://BUCKET/prefix)"
        )


def _under(path: str, storage: str) -> str:
    """A serve config's artifact: ``~/scaleforge/x`` (the shipped root) or ``x`` goes under ``storage``."""
    if is_uri(path) or path.startswith("/"):
        return path
    return f"{storage.rstrip('/')}/{re.sub(r'^~/scaleforge/?', '', path)}"


def _refuse_local(document: dict, config: str) -> None:
    if found := local_paths(document):
        field, value = found[0]
        raise ManifestError(f"{config}: {field}={value} is a local path and pods share no disk")


def dump(manifest: dict, out: Optional[str] = None) -> str:
    text = yaml.safe_dump(manifest, sort_keys=False)
    if out:
        Path(out).write_text(text)
    return text
