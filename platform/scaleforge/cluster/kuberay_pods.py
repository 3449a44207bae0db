"""Pods and worker groups of the KubeRay manifests (``scaleforge.cluster.kuberay``): CPU, GPU and TPU
workers, each with equal requests and limits."""

import math
import re
from typing import Any

from scaleforge.cluster.kuberay_check import ManifestError

APP_DIR = "/app"
"""Where the image holds the project (``pip install -e /app``), so configs are ``/app/configs/...``."""
GIB_PER_CPU = 2
"""Pod memory per CPU where a config says none: ``cluster.yaml``'s instance types have 2 (c6i) to 4
(g5) GiB per vCPU, so a pod of them fits every node type."""


def worker_group(
    name: str, image: str, cpu: float, gpu: int, memory: int, low: int, high: int, start: int
) -> dict:
    return {
        "groupName": name,
        "replicas": start,
        "minReplicas": low,
        "maxReplicas": high,
        "rayStartParams": {},
        "template": pod("ray-worker", image, cpu, gpu, memory, restart_never=True),
    }


def pod(container: str, image: str, cpu: float, gpu: int, memory: int, restart_never: bool) -> dict:
    amounts = {"cpu": quantity(cpu), "memory": f"{math.ceil(memory / 2**20)}Mi"}
    if gpu:
        amounts["nvidia.com/gpu"] = gpu
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": container,
                "image": image,
                "workingDir": APP_DIR,
                "resources": {"requests": dict(amounts), "limits": dict(amounts)},
            }
        ]
    }
    if restart_never:  # the v2 autoscaler replaces a failed pod rather than restarting it in place
        spec["restartPolicy"] = "Never"
    return {"spec": spec}


def quantity(cpu: float) -> str:
    return str(int(cpu)) if float(cpu).is_integer() else f"{math.ceil(cpu * 1000)}m"


TPU_HOST_CPUS = 8
"""CPUs a TPU host's pod asks for (GKE's TPU machines have 24 to 224): the driver's share of a host."""


def tpu_group(tpu: str, image: str) -> dict:
    """A multi-host TPU worker group: one replica per slice, ``numOfHosts`` pods per slice (Ray's own
    chips-per-host rule for the generation and topology), each asking for its host's chips
    (``google.com/tpu``) on GKE's TPU node pool (its accelerator and topology node selectors)."""
    from ray._private.accelerators.tpu import get_chips_per_host, get_num_chips_from_topology
    from ray.autoscaler._private.kuberay.utils import gke_tpu_accelerator_to_generation

    accelerator, _, rest = tpu.partition(":")
    topology, _, slices = rest.partition(":")
    generation = gke_tpu_accelerator_to_generation.get(accelerator)
    if generation is None:
        known = ", ".join(sorted(gke_tpu_accelerator_to_generation))
        raise ManifestError(f"--tpu {tpu}: unknown accelerator {accelerator!r} (GKE's: {known})")
    if not re.fullmatch(r"\d+(x\d+){1,2}", topology) or (slices and not slices.isdigit()):
        raise ManifestError(
            f"--tpu {tpu}: give ACCELERATOR:TOPOLOGY[:MAX_SLICES], e.g. tpu-v5-lite-podslice:4x4"
        )
    chips, per_host = get_num_chips_from_topology(topology), get_chips_per_host(topology, generation)
    group = worker_group(
        f"tpu-{generation}-{topology}",
        image,
        TPU_HOST_CPUS,
        0,
        TPU_HOST_CPUS * GIB_PER_CPU * 2**30,
        0,
        int(slices or 1),
        0,
    )
    group["numOfHosts"] = max(1, chips // per_host)
    spec = group["template"]["spec"]
    for amounts in spec["containers"][0]["resources"].values():
        amounts["google.com/tpu"] = str(min(chips, per_host))
    spec["nodeSelector"] = {
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": topology,
    }
    return group
