"""Hardware-aware placement of served models, decided from ``jobs.hwbench``'s measurements.

On a cluster with both CPU-only and GPU nodes, the models a router would rather run on CPU (a
cascade's first stage: small, often int8, a CPU kernel, answering most inputs cheaply) go to the
CPU nodes, and the large models (those a router marks for GPU, such as a cascade's last stage, and
anything above a parameter count) to the GPU nodes with a share of a GPU each. Placement uses
Ray's label selectors on the built-in ``ray.io/node-id`` label, so the choice follows the nodes
that ``jobs.hwbench`` measured. On a cluster of one kind (this
machine) nothing changes: Ray's default placement is already right.
"""

from dataclasses import dataclass
from typing import Iterable, Literal

from scaleforge.artifacts.store import read_manifest
from scaleforge.config.serve import ServeArgs
from scaleforge.deployment.hardware import DeviceReport

NODE_ID_LABEL = "ray.io/node-id"
Placed = Literal["cpu", "gpu", "any"]
"""Where a served model goes: the CPU-only nodes, the GPU nodes, or wherever Ray puts it."""


@dataclass(frozen=True)
class ClusterHardware:
    """Which measured nodes have GPUs (measured by hwbench, or declared to Ray) and which have none."""

    cpu_nodes: tuple[str, ...]
    gpu_nodes: tuple[str, ...]

    @classmethod
    def from_reports(cls, reports: Iterable[DeviceReport]) -> "ClusterHardware":
        gpus: dict[str, float] = {}
        for report in reports:
            if not report.node_id:
                raise ValueError(
                    f"hwbench report for {report.node}/{report.device} has no node_id: "
                    "re-run jobs.hwbench on the cluster"
                )
            measured = 1.0 if report.device.startswith("cuda") else 0.0
            gpus[report.node_id] = max(gpus.get(report.node_id, 0.0), report.node_gpus, measured)
        return cls(
            tuple(sorted(n for n, g in gpus.items() if g == 0)),
            tuple(sorted(n for n, g in gpus.items() if g > 0)),
        )

    @property
    def mixed(self) -> bool:
        return bool(self.cpu_nodes and self.gpu_nodes)


def node_selector(node_ids: Iterable[str]) -> dict[str, str]:
    """A Ray label selector matching exactly these nodes (no spaces: Ray 2.60 reads ``in(a, b)``'s
    second id with its space, as an invalid node id)."""
    return {NODE_ID_LABEL: f"in({','.join(sorted(node_ids))})"}


def place_models(
    args: ServeArgs, hardware: ClusterHardware, *, gpu_share: float = 0.25, gpu_min_parameters: int = 100_000
) -> tuple[ServeArgs, dict[str, Placed]]:
    """The Serve app ``args`` with each model's placement for ``hardware``.

    Returns:
        (new args, {model name: "cpu" | "gpu" | "any"}). The models a router hints for CPU (a
        cascade's first stage) go to the CPU nodes; those it hints for GPU (a cascade's last stage),
        and every model with at least ``gpu_min_parameters`` weights, to the GPU nodes
        (``gpu_share`` of a GPU per replica). A model placed so that the config runs inside the
        ingress (``in_ingress``) leaves it for a deployment of its own there (with its entry's
        ``num_cpus``, ``replicas`` or ``autoscaling``): the ingress runs on any node. The rest, and
        every model on a cluster of one kind, is left to Ray (then ``args`` itself comes back).
    """
    if not hardware.mixed:
        return args, {m.name: "any" for m in args.models}
    hints = [(model, where) for router in args.routers for model, where in router.placement_hints().items()]
    cheap = {model for model, where in hints if where == "cpu"}
    large = {model for model, where in hints if where == "gpu"}
    large |= {m.name for m in args.models if _parameters(m.artifact) >= gpu_min_parameters}
    if cheap & large:
        raise ValueError(
            f"models {sorted(cheap & large)} are both a router's cheap model (a cascade's first stage) "
            "and large; raise gpu_min_parameters or serve another first stage"
        )
    placed, where = [], {}
    for model in args.models:
        if model.name in cheap:
            model = model.model_copy(
                update={
                    "in_ingress": False,
                    "num_gpus": 0.0,
                    "label_selector": node_selector(hardware.cpu_nodes),
                }
            )
            where[model.name] = "cpu"
        elif model.name in large:
            model = model.model_copy(
                update={
                    "in_ingress": False,
                    "num_gpus": gpu_share,
                    "label_selector": node_selector(hardware.gpu_nodes),
                }
            )
            where[model.name] = "gpu"
        else:
            where[model.name] = "any"
        placed.append(model)
    return args.model_copy(update={"models": placed}), where


def _parameters(artifact: str) -> int:
    return int(read_manifest(artifact).get("parameters", 0))
