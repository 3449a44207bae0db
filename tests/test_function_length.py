"""No library function runs past a screen: every function and method in ``platform/scaleforge/``,
nested ones included, spans at most 60 lines from its ``def`` to its last line, docstring included.
A longer one is split into named steps, not packed into long lines (``make lint`` runs ``ruff format
--check``, which undoes packing)."""

import ast
from pathlib import Path

from conftest import REPO

LIBRARY = REPO / "platform" / "scaleforge"
MAX_LINES = 60


def _long_functions(path: Path, root: Path = REPO) -> list[str]:
    """``file:line name (N lines)`` for each function or method in ``path`` over :data:`MAX_LINES`,
    nested ones included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(root)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]


def test_no_library_function_is_over_60_lines():
    long = [entry for path in sorted(LIBRARY.rglob("*.py")) for entry in _long_functions(path)]
    assert long == [], f"split these functions (at most {MAX_LINES} lines each):\n" + "\n".join(long)


def test_the_length_reader_sees_methods_and_nested_functions(tmp_path):
    """The check above would pass vacuously if it missed a kind of function."""
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 1))  # with the def line: exactly the cap
    nested = "".join(f"        y{i} = {i}\n" for i in range(MAX_LINES))
    source = (
        f"def fits():\n{body}\n\n"
        f"async def too_long():\n{body}    x = 0\n\n\n"
        f"class Holder:\n    def method(self):\n    {body.replace(chr(10), chr(10) + '    ')}    x = 0\n\n\n"
        f"def outer():\n    def inner():\n{nested}    return inner\n"
    )
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    found = {entry.split()[1] for entry in _long_functions(probe, tmp_path)}
    assert found == {"too_long", "method", "inner", "outer"}
