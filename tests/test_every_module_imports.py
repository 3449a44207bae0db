"""Every module of the library and of the Serve apps imports on its own, so ``make test-fast`` touches
each of them (a broken import anywhere fails here in seconds, not inside a four-minute job)."""

import importlib

import pytest
from conftest import REPO

MODULES = sorted(
    ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
    for root, package in ((REPO / "platform", "scaleforge"), (REPO, "serving"))
    for path in (root / package).rglob("*.py")
    if path.name != "__main__.py"
)


def test_the_list_covers_the_library_and_the_apps():
    assert {"scaleforge.train.loop", "scaleforge.distributed.mesh", "serving.ingress"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_module_imports(module):
    assert importlib.import_module(module).__name__ == module
