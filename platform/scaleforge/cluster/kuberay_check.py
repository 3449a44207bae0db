"""Checks a KubeRay manifest the way the operator would, offline.

Two layers: the operator's rules that its CustomResourceDefinitions do not carry (resource names,
replica bounds, a RayJob's cluster, the runtime environment's YAML, autoscaler v2's restart policy,
enumerated strings), in code here; then the ``v1`` ``openAPIV3Schema`` of KubeRay v1.7.0's CRDs with
``jsonschema``, made strict: an object whose schema lists its properties accepts no other (the API
server would drop an unknown field without a word, which is how a misspelled field goes unnoticed).
The CRDs are read from ``$SCALEFORGE_KUBERAY_CRDS`` or ``../shared/kuberay/v1.7.0`` beside the
checkout, never copied into it; without them only the rules are checked.
"""

import functools
import os
import re
from pathlib import Path
from typing import Any, Optional

import yaml

from scaleforge.storage import is_uri

CRD_ENV = "SCALEFORGE_KUBERAY_CRDS"
CRD_FILES = {
    "RayJob": "ray.io_rayjobs.yaml",
    "RayService": "ray.io_rayservices.yaml",
    "RayCluster": "ray.io_rayclusters.yaml",
}
NAME_LIMITS = {"RayJob": 47, "RayService": 47, "RayCluster": 53}
"""The operator derives pod and service names from these; longer names fail at creation."""
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
UPGRADE_TYPES = ("NewCluster", "NewClusterWithIncrementalUpgrade", "None")
PATH_KEYS = ("storage", "storage_path", "output_dir", "output", "dir", "teacher", "artifact", "serve_config")
"""Config fields that name where a job reads or writes shared data (not a node's own cache)."""


class ManifestError(ValueError):
    """A manifest the operator would refuse, or a config that cannot become one; names the field."""


def crd_folder() -> Optional[Path]:
    """The KubeRay CRDs' folder: ``$SCALEFORGE_KUBERAY_CRDS``, else ``../shared/kuberay/v1.7.0`` beside
    the checkout; None when neither exists."""
    given = os.environ.get(CRD_ENV)
    folder = Path(given) if given else Path(__file__).resolve().parents[3].parent / "shared/kuberay/v1.7.0"
    return folder if folder.is_dir() else None


@functools.lru_cache(maxsize=None)
def strict_schema(kind: str) -> dict:
    """The ``v1`` ``openAPIV3Schema`` of ``kind``'s CRD, every object with listed properties closed."""
    folder = crd_folder()
    if folder is None:
        raise FileNotFoundError(f"no KubeRay CRDs: set {CRD_ENV} to the folder of {CRD_FILES[kind]}")
    crd = yaml.load(
        (folder / CRD_FILES[kind]).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    )
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    _close(schema)
    return schema


def _close(node: Any) -> None:
    if isinstance(node, dict):
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            _close(value)
    elif isinstance(node, list):
        for value in node:
            _close(value)


def check_manifest(manifest: dict) -> dict:
    """``manifest`` if the operator's rules and (with the CRDs at hand) its strict schema accept it.

    Raises:
        ManifestError: the first problem, naming the field.
    """
    kind = manifest.get("kind")
    if kind not in CRD_FILES:
        raise ManifestError(f"kind: {kind!r} is not one of {', '.join(CRD_FILES)}")
    if crd_folder() is not None:  # the schema first: the rules then read fields of the right types
        import jsonschema

        errors = sorted(
            jsonschema.Draft7Validator(strict_schema(kind)).iter_errors(manifest), key=lambda e: list(e.path)
        )
        if errors:
            raise ManifestError(
                "; ".join(f"{_dotted(error.absolute_path) or kind}: {error.message}" for error in errors[:3])
            )
    _rules(kind, manifest)
    return manifest


def _rules(kind: str, manifest: dict) -> None:
    name = manifest.get("metadata", {}).get("name", "")
    if not DNS_1035.match(name) or len(name) > NAME_LIMITS[kind]:
        raise ManifestError(
            f"metadata.name: {name!r} must be a DNS-1035 label (lower-case letters, digits, '-', starting "
            f"with a letter) of at most {NAME_LIMITS[kind]} characters for a {kind}"
        )
    spec = manifest.get("spec") or {}
    if kind == "RayJob":
        if not spec.get("rayClusterSpec") and not spec.get("clusterSelector"):
            raise ManifestError("spec: a RayJob needs rayClusterSpec or clusterSelector")
        if (mode := spec.get("submissionMode", "K8sJobMode")) not in SUBMISSION_MODES:
            raise ManifestError(f"spec.submissionMode: {mode!r} is not one of {', '.join(SUBMISSION_MODES)}")
        if "runtimeEnvYAML" in spec:
            try:
                parsed = yaml.safe_load(spec["runtimeEnvYAML"])
            except yaml.YAMLError as err:
                raise ManifestError(f"spec.runtimeEnvYAML: not YAML ({err})") from None
            if not isinstance(parsed, dict):
                raise ManifestError("spec.runtimeEnvYAML: must be a YAML mapping (a runtime environment)")
    if kind == "RayService":
        upgrade = (spec.get("upgradeStrategy") or {}).get("type", "NewCluster")
        if upgrade not in UPGRADE_TYPES:
            raise ManifestError(
                f"spec.upgradeStrategy.type: {upgrade!r} is not one of {', '.join(UPGRADE_TYPES)}"
            )
    where = {"RayJob": "rayClusterSpec", "RayService": "rayClusterConfig", "RayCluster": None}[kind]
    cluster = spec.get(where) if where else spec
    if cluster:
        _cluster_rules(cluster, f"spec.{where}." if where else "spec.")


def _cluster_rules(cluster: dict, prefix: str) -> None:
    v2 = (
        cluster.get("enableInTreeAutoscaling")
        and (cluster.get("autoscalerOptions") or {}).get("version") == "v2"
    )
    for index, group in enumerate(cluster.get("workerGroupSpecs") or []):
        at = f"{prefix}workerGroupSpecs[{index}]"
        low, high = group.get("minReplicas", 0), group.get("maxReplicas", 0)
        if isinstance(low, int) and isinstance(high, int) and low > high:
            raise ManifestError(f"{at}.minReplicas: {low} is above maxReplicas {high}")
        if not (group.get("template", {}).get("spec", {}).get("containers")):
            raise ManifestError(f"{at}.template.spec.containers: a worker group needs its Ray container")
        policy = group.get("template", {}).get("spec", {}).get("restartPolicy")
        if v2 and policy != "Never":
            raise ManifestError(
                f"{at}.template.spec.restartPolicy: autoscaler v2 needs Never, not {policy!r}"
            )
    if not (cluster.get("headGroupSpec", {}).get("template", {}).get("spec", {}).get("containers")):
        raise ManifestError(
            f"{prefix}headGroupSpec.template.spec.containers: the head needs its Ray container"
        )


def local_paths(document: Any, at: str = "") -> list[tuple[str, str]]:
    """``(dotted field, value)`` of each field of :data:`PATH_KEYS` in ``document`` naming a local file or
    folder (not a URI)."""
    found = []
    if isinstance(document, dict):
        for key, value in document.items():
            field = f"{at}.{key}" if at else str(key)
            if key in PATH_KEYS and isinstance(value, str) and _a_path(value) and not is_uri(value):
                found.append((field, value))
            else:
                found += local_paths(value, field)
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += local_paths(value, f"{at}[{index}]")
    return found


def _a_path(value: str) -> bool:
    """A file or folder, not a name (a pipeline's ``serve.models`` maps names to its stages)."""
    return "/" in value or value.startswith("~")


def _dotted(path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text
