"""The rules that keep the library changeable, read from the source (AST), so they stay true:

- the library never imports the app code in ``jobs/`` or ``serving/`` (nor ``tests/``, ``bench/``): an
  installed ``scaleforge`` works without them, and they can change without touching it;
- ``scaleforge.distributed`` is model-agnostic: it imports nothing from ``scaleforge.models``
  (each model family describes how it splits in ``models/plans.py``);
- model files hold architecture: they never import Ray;
- no file under ``platform/`` is longer than 250 lines.
"""

import ast
from pathlib import Path

import pytest
from conftest import REPO

LIBRARY = REPO / "platform" / "scaleforge"
MAX_LINES = 250


def _imports(path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """Every module a file imports (absolute names; relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(root / "platform").with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base]) if base else ".".join(parent)
            found += [(node.lineno, f"{base}.{alias.name}" if base else alias.name) for alias in node.names]
    return found


def _violations(folder: Path, forbidden) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in sorted(folder.rglob("*.py"))
        for line, name in _imports(path)
        if forbidden(name)
    ]


def _is(name: str, *roots: str) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def test_the_library_never_imports_app_code():
    assert _violations(LIBRARY, lambda name: _is(name, "jobs", "serving", "tests", "bench")) == []


def test_distributed_imports_nothing_model_specific():
    assert _violations(LIBRARY / "distributed", lambda name: _is(name, "scaleforge.models")) == []


def test_model_files_never_import_ray():
    assert _violations(LIBRARY / "models", lambda name: _is(name, "ray")) == []


def test_no_library_file_is_over_250_lines():
    long = {
        str(p.relative_to(REPO)): n
        for p in LIBRARY.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these files (at most {MAX_LINES} lines each): {long}"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import jobs.train", ["jobs.train"]),
        ("from serving.app import build_app", ["serving.app.build_app"]),
        ("from ..models import plans", ["scaleforge.models.plans"]),
        ("def f():\n    from scaleforge.models.moe import moe_layers", ["scaleforge.models.moe.moe_layers"]),
    ],
)
def test_the_rule_reader_sees_every_kind_of_import(tmp_path, source, expected):
    """The checks above would pass vacuously if imports were missed: relative, nested and from-imports
    count."""
    probe = tmp_path / "platform" / "scaleforge" / "distributed" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(source + "\n")
    assert [name for _, name in _imports(probe, root=tmp_path)] == expected
