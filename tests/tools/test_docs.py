"""The documentation stays true: a short front page, paths that exist, a config reference that matches
the schemas."""

import difflib
import re
from typing import Annotated, Literal, Optional, Union

import pytest
from conftest import REPO
from pydantic import BaseModel, ConfigDict, Field

from bench.results_tables import STAMP
from scaleforge.config.reference import render

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A repository path in prose or code: `tests/serving/test_serving_http.py`, `configs/serve.yaml`,
# `docs/results.md`.
# Placeholders (`bench/results/<name>.failed`, `tests/<area>/test_*.py`) are not paths and do not match.
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:bench|configs|docs|jobs|platform|serving|tests)/[\w./-]*\w)(?![\w/<*-])"
)
TEST_NAME = re.compile(r"(?<![\w./-])((?:bench|tests)/[\w./-]*\.py)::(\w+)")
# A test cited without its folder: `test_compress_steps.py`, `test_async_sgd.py::test_each_mode_...`,
# or by its name alone: `test_each_mode_converges_through_a_fault`.
TEST_FILE = re.compile(r"(?<![\w./-])(test_\w+\.py)(?:::(\w+))?")
TEST_FUNCTION = re.compile(r"`(test_\w+)`")
GENERATED = ("config.md",)
"""Pages written from the schemas (`make docs`): a backquoted `test_path` there is a config field."""
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")


def _anchors(page) -> set[str]:
    """GitHub's heading anchors (lower case, punctuation dropped, spaces to hyphens) and explicit ids."""
    text = re.sub(
        r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL
    )  # shell comments are no headings
    headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings} | set(
        re.findall(r'id="([^"]+)"', text)
    )


def test_the_readme_is_a_front_page_of_at_most_150_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_history_stays_in_the_commits(page):
    # A content digest ("sha256:881d66184cbe...", a corpus fingerprint in a benchmark's output) is no commit,
    # nor the commit a benchmark's table names in its stamp as the code it measured.
    text = "\n".join(line for line in page.read_text().splitlines() if not STAMP.match(line))
    hashes = [
        h
        for h in re.findall(r"(?<!sha256:)\b[0-9a-f]{7,40}\b", text)
        if re.search(r"[a-f]", h) and re.search(r"\d", h)
    ]
    assert not hashes, (
        f"{page.relative_to(REPO)} names commits ({', '.join(hashes)}); history belongs in commit messages"
    )


def test_the_docs_pages_exist():
    names = {page.name for page in PAGES}
    for page in (
        "training.md",
        "paramserver.md",
        "compression.md",
        "serving.md",
        "cluster.md",
        "artifacts.md",
        "config.md",
        "results.md",
    ):
        assert page in names, f"docs/{page} is missing"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_path_and_link_in_the_docs_exists(page):
    text = page.read_text()
    missing = [path for path in REPO_PATH.findall(text) if not (REPO / path).exists()]
    links = [
        ((page.parent / link).resolve() if link else page, anchor)
        for link, anchor in LINK.findall(text)
        if "://" not in link
    ]
    missing += [str(target.relative_to(REPO)) for target, _ in links if not target.exists()]
    missing += [
        f"{target.relative_to(REPO)}#{anchor}"
        for target, anchor in links
        if anchor and target.exists() and anchor not in _anchors(target)
    ]
    assert not missing, (
        f"{page.relative_to(REPO)} names paths or anchors that do not exist: "
        f"{', '.join(sorted(set(missing)))}"
    )
    for path, name in TEST_NAME.findall(text):
        assert re.search(rf"^\s*def {name}\b", (REPO / path).read_text(), re.MULTILINE), (
            f"{page.relative_to(REPO)} cites {path}::{name}, which is not defined there"
        )


def _tests_by_file() -> dict[str, set[str]]:
    """Every test file's name (``test_x.py``) and the test functions it defines."""
    found: dict[str, set[str]] = {}
    for path in (REPO / "tests").rglob("test_*.py"):
        names = set(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE))
        found.setdefault(path.name, set()).update(names)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_test_the_docs_cite_exists(page):
    """A claim backed by a test names it: a test file by its name alone, or a test function with or
    without its file (with its path, the check above reads that very file)."""
    text, tests = page.read_text(), _tests_by_file()
    defined = set().union(*tests.values())
    missing = [
        f"{file}::{name}" if name else file
        for file, name in TEST_FILE.findall(text)
        if file not in tests or (name and name not in tests[file])
    ]
    if page.name not in GENERATED:
        missing += [name for name in TEST_FUNCTION.findall(text) if name not in defined]
    assert not missing, (
        f"{page.relative_to(REPO)} cites tests that do not exist: {', '.join(sorted(set(missing)))}"
    )


def test_the_config_reference_matches_the_schemas():
    committed, fresh = (REPO / "docs/config.md").read_text(), render()
    diff = "\n".join(
        list(
            difflib.unified_diff(
                committed.splitlines(), fresh.splitlines(), "docs/config.md", "the schemas", lineterm=""
            )
        )[:20]
    )
    assert committed == fresh, f"docs/config.md differs from the schemas; run `make docs`:\n{diff}"


def test_the_config_reference_documents_every_model_and_every_compression_step():
    text = render()
    for model in ("mlp", "cnn1d", "transformer", "moe", "moe_gate"):
        assert f"### `model` with `name: {model}`" in text
        assert f"### `recipe.<i>.student` with `name: {model}`" in text
    for step in ("distill", "prune", "low_rank", "quantize", "export"):
        assert f"### `recipe.<i>` with `step: {step}`" in text
    assert "| `parallel.tp` | `int` > 0 | `1` | Tensor parallel (transformer)" in text
    assert "| `model.batch_norm` | `bool` | `false` |" in text  # jobs.async_sgd's own default model


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: int = Field(default=3, gt=0)
    """Base size."""
    label: str = "base"
    """Base label."""


class _Apple(_Base):
    kind: Literal["apple"] = "apple"
    label: str = "apple"
    """The apple's own label."""


class _Pear(_Base):
    kind: Literal["pear"] = "pear"
    """Which fruit."""


class _Basket(BaseModel):
    """A toy job schema."""

    fruit: Annotated[Union[_Apple, _Pear], Field(discriminator="kind")] = Field(default_factory=_Pear)
    extras: list[_Base] = Field(default_factory=list, min_length=1)
    """More of the base."""
    weight: Optional[float] = Field(default=None, ge=0)


def test_a_schema_is_walked_through_unions_lists_and_base_classes():
    text = render({"jobs.basket": _Basket})
    assert "## `jobs.basket` (_Basket)\n\nA toy job schema." in text
    assert (
        "| `fruit` | one of [`apple`](#jobs-basket-fruit-apple), [`pear`](#jobs-basket-fruit-pear) "
        "(chosen by `kind`) | `pear` |" in text
    )
    assert (
        "| `extras` | non-empty list of [`_Base`](#jobs-basket-extras) | `[]` | More of the base. |" in text
    )
    assert "| `weight` | `float` >= 0 or null | `null` |  |" in text
    assert "| `fruit.size` | `int` > 0 | `3` | Base size. |" in text  # docstrings found in the base class
    assert "| `fruit.label` | `str` | `apple` | The apple's own label. |" in text  # the subclass's own wins
    assert "| `fruit.kind` | `pear` | `pear` | Which fruit. |" in text
    assert "| `extras.<i>.label` | `str` | `base` | Base label. |" in text
