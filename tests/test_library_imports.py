"""The library never imports app code: `jobs/` and `serving/` build on `scaleforge`, never the reverse
(an installed `scaleforge` then works without them, and they can change without touching it)."""

import ast

from conftest import REPO

APP_PACKAGES = ("jobs", "serving", "tests", "bench")


def _imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):  # every import, also those inside functions
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_the_library_imports_no_app_module():
    offending = []
    for path in sorted((REPO / "platform" / "scaleforge").rglob("*.py")):
        for module in _imported_modules(ast.parse(path.read_text(), filename=str(path))):
            if module.split(".")[0] in APP_PACKAGES:
                offending.append(f"{path.relative_to(REPO)}: import {module}")
    assert offending == []
