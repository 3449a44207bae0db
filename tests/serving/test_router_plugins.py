"""Adding a router kind is one file (its entry and its runtime class) and one registration line: each
built-in kind is one module of ``scaleforge.routers``; the ingress, the serve config's union,
deployment and the protocol name no kind; and a kind defined outside the library (``ensemble_router``,
an ensemble, one file) is checked, described and served over real HTTP by the same code."""

import ast
import inspect
from pathlib import Path
from typing import get_args

import httpx
import numpy as np
import pytest
import torch
from conftest import REPO
from pydantic import ValidationError
from ray import serve
from serving_env import running_serve, small_deployment, v2_body

from scaleforge.artifacts import save_artifact
from scaleforge.artifacts.servable import load_servable
from scaleforge.config.serve import ServeArgs
from scaleforge.models import MLPSpec, build_model
from scaleforge.routers import ROUTER_ENTRIES, RouterEntries, router_kinds
from scaleforge.serving_contract import model_infos
from serving.app import build_app
from serving.routers import Router
from tests.serving.ensemble_router import EnsembleArgs

KIND_FREE = sorted(
    [
        *(
            REPO / "serving" / name
            for name in (
                "app.py",
                "ingress.py",
                "http.py",
                "protocol.py",
                "responses.py",
                "grpc_v2.py",
                "models.py",
            )
        ),
        REPO / "serving" / "routers" / "__init__.py",
        REPO / "platform" / "scaleforge" / "config" / "serve.py",
        REPO / "platform" / "scaleforge" / "serving_contract.py",
        REPO / "platform" / "scaleforge" / "routers" / "base.py",
        *(REPO / "platform" / "scaleforge" / "deployment").glob("*.py"),
    ]
)
"""The modules every router goes through; none of them may know one kind from another."""


def _kind_names() -> tuple[set[str], set[str]]:
    """(words that name a kind: the kind, its plural, its entry and runtime classes; modules of a kind)."""
    words, modules = set(), set()
    for entry in ROUTER_ENTRIES:
        runtime = entry.router
        kind = get_args(entry.model_fields["kind"].annotation)[0]
        words |= {kind, f"{kind}s", entry.__name__, runtime.__name__}
        modules |= {entry.__module__, runtime.__module__}
    return words, modules


def _kind_mentions(source: str, words: set[str], modules: set[str]) -> list[str]:
    """Where ``source`` names a router kind: a string, a name or attribute, or an import of its module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in words:
            found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Name) and node.id in words:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in words:
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (
            node.module in modules or any(alias.name in words for alias in node.names)
        ):
            found.append(f"{node.lineno}: from {node.module}")
        elif isinstance(node, ast.Import) and any(alias.name in modules for alias in node.names):
            found.append(f"{node.lineno}: import")
    return found


def test_the_config_union_and_the_runtime_routers_come_from_the_registry():
    assert router_kinds() == ["cascade", "moe", "early_exit", "generator"]
    assert get_args(get_args(RouterEntries)[0]) == ROUTER_ENTRIES
    assert ServeArgs.model_fields["routers"].annotation == list[RouterEntries]
    protocol = list(inspect.signature(Router.__init__).parameters)
    for entry in ROUTER_ENTRIES:
        runtime = entry.router
        assert list(inspect.signature(runtime.__init__).parameters) == protocol
        assert inspect.iscoroutinefunction(runtime.infer)


def test_each_built_in_kind_is_one_module_holding_its_entry_and_its_runtime():
    package = REPO / "platform" / "scaleforge" / "routers"
    modules = [inspect.getmodule(entry) for entry in ROUTER_ENTRIES]
    for entry, module in zip(ROUTER_ENTRIES, modules):
        kind = get_args(entry.model_fields["kind"].annotation)[0]
        assert inspect.getmodule(entry.router) is module
        assert module.__name__ == f"scaleforge.routers.{kind}"
        assert Path(module.__file__) == package / f"{kind}.py"
    assert sorted(p.name for p in package.glob("*.py")) == sorted(
        ["__init__.py", "base.py", *(Path(m.__file__).name for m in modules)]
    )


def test_no_module_that_every_router_goes_through_names_a_router_kind():
    words, modules = _kind_names()
    mentions = {
        str(path.relative_to(REPO)): found
        for path in KIND_FREE
        if (found := _kind_mentions(path.read_text(), words, modules))
    }
    assert mentions == {}


@pytest.mark.parametrize(
    "source",
    [
        'if kind == "cascade":\n    pass',
        "for router in args.moe:\n    pass",
        "from scaleforge.routers.moe import MoERouter",
        "from scaleforge.routers import CascadeEntry",
        "import scaleforge.routers.cascade",
    ],
)
def test_the_kind_reader_sees_every_way_of_naming_a_kind(source):
    """The check above would pass vacuously if it missed a way of naming a kind."""
    assert _kind_mentions(source, *_kind_names()) != []


def _mlp(folder: Path, seed: int) -> str:
    torch.manual_seed(seed)
    spec = MLPSpec(hidden=[16])
    return str(save_artifact(folder, build_model(spec, 40, 10), spec, input_dim=40, num_classes=10))


def _ensemble_args(tmp_path: Path, members: list[str]) -> EnsembleArgs:
    return EnsembleArgs.model_validate(
        {
            "models": [
                {"name": name, "artifact": _mlp(tmp_path / name, seed), "in_ingress": True}
                for seed, name in enumerate(["a", "b"])
            ],
            "routers": [{"kind": "ensemble", "name": "ensemble", "members": members}],
            "ingress": small_deployment(max_ongoing_requests=16),
        }
    )


def test_a_new_kind_is_checked_and_described_by_the_library_as_it_is(tmp_path):
    with pytest.raises(ValidationError, match="ensemble 'ensemble' names models that are not served: c"):
        _ensemble_args(tmp_path, ["a", "c"])
    info = model_infos(_ensemble_args(tmp_path, ["a", "b"]))["ensemble"]
    assert (info.kind, info.input_dim, info.num_classes) == ("ensemble", 40, 10)
    assert [o.name for o in info.outputs] == ["class", "probabilities", "agreement"]


def test_a_new_kind_is_served_over_http_by_the_unchanged_ingress(ray_cluster, tmp_path):
    args = _ensemble_args(tmp_path, ["a", "b"])
    port, app = running_serve(), "sf-ensemble"
    serve.run(build_app(args), name=app, route_prefix=f"/{app}")
    x = np.random.default_rng(0).normal(size=(32, 40)).astype(np.float32)
    try:
        base = f"http://127.0.0.1:{port}/{app}/v2/models"
        answer = httpx.post(f"{base}/ensemble/infer", json=v2_body(x, trace=True), timeout=60)
        metadata = httpx.get(f"{base}/ensemble", timeout=60).json()
    finally:
        serve.delete(app)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in answer.json()["outputs"]}
    with torch.inference_mode():
        probs = [_probabilities(args.model(name).artifact, x) for name in ("a", "b")]
    np.testing.assert_allclose(outputs["probabilities"], (probs[0] + probs[1]) / 2, atol=1e-5)
    np.testing.assert_array_equal(outputs["agreement"], probs[0].argmax(1) == probs[1].argmax(1))
    assert answer.json()["parameters"] == {"members": 2}
    assert metadata["platform"] == "scaleforge-ensemble"
    assert {"name": "agreement", "datatype": "BOOL", "shape": [-1]} in metadata["outputs"]


def _probabilities(artifact: str, x: np.ndarray) -> np.ndarray:
    return load_servable(artifact).module(torch.from_numpy(x)).softmax(dim=-1).numpy()
