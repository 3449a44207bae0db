"""``scaleforge.routing`` is pure policy over tensors: the same functions route online (``serving/``) and
calibrate offline (``scaleforge.calibrate``), so they import no I/O, no Ray and no YAML, and open nothing.
Loading models, data and configs, and writing files, happen around them (read from the source, AST)."""

import ast
from pathlib import Path

import pytest
from conftest import REPO

ROUTING = REPO / "platform" / "scaleforge" / "routing"

FORBIDDEN_MODULES = (
    # Ray and the serving and network stacks
    "ray",
    "httpx",
    "requests",
    "socket",
    "urllib",
    "http",
    "subprocess",
    # files, formats and storage
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "glob",
    "pickle",
    "json",
    "csv",
    "yaml",
    "safetensors",
    "pyarrow",
    "fsspec",
    "filelock",
    # the library's own I/O: storage, artifacts, configs (schemas and their loader), data, jobs' plumbing
    "scaleforge.storage",
    "scaleforge.artifacts",
    "scaleforge.config",
    "scaleforge.data",
    "scaleforge.calibrate",
    "scaleforge.pipeline",
    "scaleforge.deployment",
    "scaleforge.cluster",
    "scaleforge.runtime",
)
FORBIDDEN_CALLS = {"open", "load", "save", "read_text", "write_text", "read_bytes", "write_bytes"}
"""``open(...)``, ``torch.load``/``torch.save``/``np.load``, and ``Path``'s readers and writers."""


def _violations(path: Path) -> list[str]:
    """Each forbidden import and call in ``path``, as ``file:line what``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if any(name == root or name.startswith(root + ".") for root in FORBIDDEN_MODULES):
                found.append(f"{path.name}:{node.lineno} imports {name}")
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called in FORBIDDEN_CALLS:
                found.append(f"{path.name}:{node.lineno} calls {called}()")
    return found


def test_routing_imports_no_io_ray_or_yaml_and_opens_nothing():
    files = sorted(ROUTING.rglob("*.py"))
    assert {p.name for p in files} >= {"__init__.py", "cascade.py", "experts.py", "gates.py"}
    assert [v for path in files for v in _violations(path)] == []


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import yaml", "t.py:1 imports yaml"),
        ("def f():\n    from ray import serve", "t.py:2 imports ray.serve"),
        ("from pathlib import Path", "t.py:1 imports pathlib.Path"),
        (
            "from scaleforge.config.loader import load_config",
            "t.py:1 imports scaleforge.config.loader.load_config",
        ),
        ("from scaleforge.storage import read_text", "t.py:1 imports scaleforge.storage.read_text"),
        (
            "from scaleforge.artifacts.servable import load_servable",
            "t.py:1 imports scaleforge.artifacts.servable.load_servable",
        ),
        ("with open('thresholds.yaml') as f:\n    pass", "t.py:1 calls open()"),
        ("import numpy as np\nstate = np.load('m.npy')", "t.py:2 calls load()"),
    ],
)
def test_the_rule_catches_each_kind_of_io(tmp_path, source, expected):
    path = tmp_path / "t.py"
    path.write_text(source)
    assert _violations(path) == [expected]
