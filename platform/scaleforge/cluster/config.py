"""``cluster.yaml``: checked with Ray's own launcher schema, then turned into a local simulation.

Ray's schema (``ray.autoscaler._private.util.validate_config``, the check ``ray up`` runs) catches
malformed configs; on top of it we refuse what would be unsafe or unusable for this project: a
dashboard opened beyond localhost, a GPU instance that does not declare its GPUs (the autoscaler
could never pick it for GPU work), a node type without declared resources.
"""

import copy
import re
from pathlib import Path
from typing import Any, Optional

import yaml

# Instance families that carry GPUs: their node types must declare a GPU resource.
_GPU_INSTANCE = re.compile(r"^(g4dn|g5|g6|g6e|p3|p4d|p4de|p5|p5e)\.", re.IGNORECASE)


class ClusterConfigError(ValueError):
    """A cluster config that Ray's launcher or this project would reject; the message names the field."""


def load_cluster_config(path: str | Path) -> dict[str, Any]:
    """Read ``path`` and validate it as ``ray up`` would, plus the project's own rules.

    Returns:
        The config as written (not filled with Ray's defaults).

    Raises:
        ClusterConfigError: naming the file and the offending field.
    """
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ClusterConfigError(f"{path}: cannot read: {err}") from None
    if not isinstance(config, dict):
        raise ClusterConfigError(f"{path}: a cluster config is a mapping, got {type(config).__name__}")
    for problem in _ray_schema_problems(config) or _project_problems(config):
        raise ClusterConfigError(f"{path}: {problem}")
    return config


def _ray_schema_problems(config: dict[str, Any]) -> list[str]:
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    try:
        validate_config(prepare_config(copy.deepcopy(config)))
    except jsonschema.ValidationError as err:
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        return [f"{where}: {err.message}"]
    except (ValueError, KeyError, TypeError) as err:
        return [f"rejected by Ray's cluster-config validation: {err}"]
    return []


def _project_problems(config: dict[str, Any]) -> list[str]:
    problems = []
    head_commands = " ".join(config.get("head_start_ray_commands", []))
    if "--dashboard-host" in head_commands and "--dashboard-host=127.0.0.1" not in head_commands:
        problems.append(
            "head_start_ray_commands: the dashboard must listen on 127.0.0.1 "
            "(reach it with `ray dashboard cluster.yaml`), not on a public interface"
        )
    for name, node_type in config["available_node_types"].items():
        resources = node_type.get("resources") or {}
        if name != config["head_node_type"] and "CPU" not in resources:
            problems.append(
                f"available_node_types.{name}.resources: declare CPU (and GPU) so the autoscaler "
                "knows what the node offers before launching it"
            )
        instance = str((node_type.get("node_config") or {}).get("InstanceType", ""))
        if _GPU_INSTANCE.match(instance) and not resources.get("GPU"):
            problems.append(
                f"available_node_types.{name}.resources: {instance} has GPUs; declare them as GPU: <count>"
            )
    return problems


def simulated_config(
    config: dict[str, Any],
    *,
    idle_timeout_minutes: Optional[float] = None,
    max_workers_per_type: Optional[int] = None,
) -> dict[str, Any]:
    """A ``fake_multinode`` autoscaler config with ``config``'s node types, for one machine.

    Each worker node type keeps its declared resources (logical CPUs and GPUs: a fake node is a
    raylet on this machine that advertises them), its min and max workers; cloud-only fields
    (instance types, setup commands) are dropped. Ray's wheel lacks the base config that
    ``ray.cluster_utils.AutoscalingCluster`` reads, so it is written out here in full.
    """
    return {
        "cluster_name": f"{config['cluster_name']}-simulated",
        "max_workers": config.get("max_workers", 2),
        "upscaling_speed": config.get("upscaling_speed", 1.0),
        "idle_timeout_minutes": (
            config.get("idle_timeout_minutes", 5) if idle_timeout_minutes is None else idle_timeout_minutes
        ),
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        },
        "available_node_types": _simulated_node_types(config, max_workers_per_type),
        "head_node_type": "ray.head.default",
        **_NO_CLOUD_SETUP,
    }


_NO_CLOUD_SETUP: dict[str, Any] = {
    "auth": {},
    "docker": {},
    "file_mounts": {},
    "cluster_synced_files": [],
    "file_mounts_sync_continuously": False,
    "rsync_exclude": [],
    "rsync_filter": [],
    "initialization_commands": [],
    "setup_commands": [],
    "head_setup_commands": [],
    "worker_setup_commands": [],
    "head_start_ray_commands": [],
    "worker_start_ray_commands": [],
}
"""The fields of Ray's base config that a fake node on this machine leaves empty (no SSH, no setup)."""


def _simulated_node_types(config: dict[str, Any], max_workers_per_type: Optional[int]) -> dict[str, Any]:
    """The head as ``ray.head.default`` and each worker type with its resources, min and max workers."""
    head = config["head_node_type"]
    node_types = {
        "ray.head.default": {
            "resources": dict(config["available_node_types"][head].get("resources") or {}),
            "node_config": {},
            "max_workers": 0,
        },
    }
    for name, node_type in config["available_node_types"].items():
        if name == head:
            continue
        max_workers = node_type.get("max_workers", config.get("max_workers", 2))
        if max_workers_per_type is not None:
            max_workers = min(max_workers, max_workers_per_type)
        node_types[name] = {
            "resources": dict(node_type.get("resources") or {}),
            "node_config": {},
            "min_workers": node_type.get("min_workers", 0),
            "max_workers": max_workers,
        }
    return node_types
