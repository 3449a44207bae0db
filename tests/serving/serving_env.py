"""What the serving tests share: small real models trained once per session, and a running Serve.

The models are trained in-process in seconds (``scaleforge.quickfit``) and exported as artifacts:
a small CNN (cascade stage 0), a larger CNN (the teacher, stage 1) and an MoE classifier split
into a gate and four expert artifacts. Each test module imports these helpers; the models are
trained once per suite run, into the folder that pytest-xdist's workers share, under a file lock.
"""

import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
from filelock import FileLock

from scaleforge.artifacts import save_artifact
from scaleforge.artifacts.parts import save_moe_parts
from scaleforge.data import load_mnist1d
from scaleforge.models import CNN1dSpec, MoESpec
from scaleforge.quickfit import fit_and_save, fit_classifier

STUDENT = CNN1dSpec(channels=[16, 32], hidden=64, pool=True)
TEACHER = CNN1dSpec(channels=[32, 64, 64], hidden=128)
MOE = MoESpec(
    stem_channels=[16, 16], d_model=32, num_experts=4, expert_hidden=32, top_k=2, aux_loss_weight=0.02
)

_CACHE: dict[str, dict[str, str]] = {}


def mnist1d() -> dict[str, np.ndarray]:
    return load_mnist1d(20_000, 42, 0.2, "~/.cache/scaleforge")


def trained_models(factory: pytest.TempPathFactory) -> dict[str, str]:
    """Artifact folders by role: ``student``, ``teacher``, ``moe-gate``, ``moe-expert-<i>``.

    ``factory``: pytest's ``tmp_path_factory``. The first worker to ask trains them (about half a
    minute of both cores) into the run's shared temporary folder; the others wait on the lock and
    read the index it wrote last."""
    if "models" not in _CACHE:
        base = factory.getbasetemp()
        root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "serving-models"
        index = root / "models.json"
        with FileLock(f"{root}.lock"):
            if not index.is_file():
                index.parent.mkdir(parents=True, exist_ok=True)
                index.write_text(json.dumps(_train(root)))
        _CACHE["models"] = json.loads(index.read_text())
    return _CACHE["models"]


def _train(root: Path) -> dict[str, str]:
    torch.set_num_threads(2)
    data = mnist1d()
    models = {
        "student": fit_and_save(root / "student", STUDENT, data, epochs=6),
        "teacher": fit_and_save(root / "teacher", TEACHER, data, epochs=4),
    }
    moe = fit_classifier(MOE, data["x"], data["y"], epochs=6)
    # The whole model too (not served): tests compare the router's output with it.
    save_artifact(root / "moe", moe, MOE, input_dim=40, num_classes=10)
    parts = save_moe_parts(root / "moe", moe, MOE, input_dim=40, num_classes=10, dataset={})
    models["moe-gate"] = parts["gate"]
    models |= {f"moe-expert-{i}": path for i, path in enumerate(parts["experts"])}
    return {role: str(path) for role, path in models.items()}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def running_serve(grpc_port: int | None = None) -> int:
    """The session's Serve on the shared cluster, started on first use on a free port of 127.0.0.1
    (or again, on the same port, after a test shut it down); returns the port. Tests that share it
    deploy and delete their own apps, and leave Serve running. ``grpc_port``: Serve starts anew with
    its gRPC proxy serving KServe V2's service on that port too."""
    from ray import serve

    from scaleforge.config.serve import GrpcOptions

    port = _CACHE.setdefault("serve", {"port": free_port()})["port"]
    if grpc_port is None:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    else:
        serve.shutdown()  # a no-op where none runs; a running one keeps the options it started with
        serve.start(
            http_options={"host": "127.0.0.1", "port": port},
            grpc_options=GrpcOptions(port=grpc_port).model_dump(),
        )
    return port


def small_deployment(**overrides) -> dict:
    """Deployment settings that fit many replicas on the test cluster's 4 logical CPUs."""
    return {"num_cpus": 0.1, **overrides}


def serve_args(models: dict[str, str], *, threshold: float = 0.8, token_file: str | None = None) -> dict:
    """App args for the student/teacher cascade and the MoE router over the trained artifacts."""
    experts = sorted(role for role in models if role.startswith("moe-expert-"))
    entries = [{"name": role, "artifact": path, **small_deployment()} for role, path in models.items()]
    return {
        "models": entries,
        "routers": [
            {
                "kind": "cascade",
                "name": "cascade",
                "measure": "max_prob",
                "stages": [{"model": "student", "threshold": threshold}, {"model": "teacher"}],
            },
            {
                "kind": "moe",
                "name": "moe",
                "gate": "moe-gate",
                "experts": experts,
                "top_k": 2,
                # 1 s was missed by a healthy expert on a loaded 2-core machine (the suite beside it)
                "expert_timeout_s": 5.0,
                "down_for_s": 30.0,
            },
        ],
        "ingress": small_deployment(max_ongoing_requests=64),
        "auth": {"token_file": token_file} if token_file else {},
        "limits": {"max_batch_size": 2048, "max_body_bytes": 2 * 1024 * 1024},
    }


def v2_body(x: np.ndarray, **parameters) -> dict:
    return {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
        "parameters": parameters,
    }


def output(response: dict, name: str) -> np.ndarray:
    tensor = next(t for t in response["outputs"] if t["name"] == name)
    return np.asarray(tensor["data"]).reshape(tensor["shape"])


# Which rows of the Grafana dashboard (serving/grafana_dashboard.json) each served test app feeds:
# that file's last test scrapes /metrics for every metric those rows' queries read.
DASHBOARD_ROWS = {
    "test_serving_http.py": ("Requests", "Cascades", "Mixture of experts"),
    "test_generator.py": ("Requests", "Language models"),
}


def dashboard_metrics(rows: tuple[str, ...] | None = None) -> set[str]:
    """Every metric the committed dashboard's queries read (of the named rows' panels, if given).
    Each query is parsed as PromQL, so one that Prometheus would refuse fails here."""
    import promql_parser

    from serving.dashboard import COMMITTED

    names: set[str] = set()

    def visit(expr):
        if isinstance(expr, promql_parser.VectorSelector):
            names.add(expr.name)

    row = None
    for panel in json.loads(COMMITTED.read_text())["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        elif rows is None or row in rows:
            for target in panel["targets"]:
                promql_parser.walk(promql_parser.parse(target["expr"]), pre_visit=visit)
    return names


def prometheus_samples(metrics_port: int) -> list[tuple[str, str, float]]:
    """``(name, labels, value)`` of every sample the session node's ``/metrics`` exports now."""
    import httpx

    samples = []
    for line in httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            samples.append((name, labels.rstrip("}"), float(value)))
    return samples


def missing_metrics(metrics_port: int, names: set[str], timeout_s: float = 60) -> set[str]:
    """The names of ``names`` that ``/metrics`` still lacks after up to ``timeout_s`` (Ray exports
    what replicas record every few seconds, so it is polled)."""
    import time

    deadline = time.monotonic() + timeout_s
    while (missing := names - {name for name, _, _ in prometheus_samples(metrics_port)}) and (
        time.monotonic() < deadline
    ):
        time.sleep(2)
    return missing
