"""No code outside the model registry decides anything by comparing a model's name to a string: it asks
the family's capabilities (``spec.capabilities``, ``capabilities_of(name)``) or its registration
(``model_family(name)``), so adding a family never touches the layers that use models.

Read from the source (AST), over the library, the jobs, the Serve apps and the benches. Exempt:

- ``scaleforge/models/``, the registry itself (families, their modules and plans);
- ``scaleforge/config/models.py``, the specs' home: it stays in ``config/`` because configs validate
  without importing torch, and ``scaleforge/models/__init__.py`` imports torch; the specs' ``name``
  literals and capabilities are the registrations' torch-free half;
- the word ``moe`` where it names something else than a model: the pipeline's MoE stage and the
  Serve MoE router (:data:`OTHER_MEANINGS`).
"""

import ast
from pathlib import Path

import pytest
from conftest import REPO

from scaleforge.config.models import MODEL_NAMES

LIBRARY = REPO / "platform" / "scaleforge"
SCANNED = [LIBRARY, REPO / "jobs", REPO / "serving", REPO / "bench"]
REGISTRY = [LIBRARY / "models", LIBRARY / "config" / "models.py"]
OTHER_MEANINGS = {"moe": [LIBRARY / "pipeline", LIBRARY / "routers"]}
"""Family names that are also the name of a pipeline stage or a serving router, and where they are."""


def _literals(node: ast.AST) -> list[str]:
    """The string constants an operand of a comparison names (``"a"``, or ``("a", "b")`` and its kin)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [name for element in node.elts for name in _literals(element)]
    return []


def name_comparisons(source: str) -> list[tuple[int, str]]:
    """``(line, family name)`` of every comparison (``==``, ``!=``, ``in``, ``not in``, a ``match``
    case) of something with a registered family's name as a literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        found += [(node.lineno, name) for op in operands for name in _literals(op) if name in MODEL_NAMES]
    return found


def _within(path: Path, places: list[Path]) -> bool:
    return any(path == place or place in path.parents for place in places)


def _violations() -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{line} compares a model name to {name!r}"
        for root in SCANNED
        for path in sorted(root.rglob("*.py"))
        if not _within(path, REGISTRY)
        for line, name in name_comparisons(path.read_text())
        if not _within(path, OTHER_MEANINGS.get(name, []))
    ]


def test_no_model_name_is_compared_outside_the_registry():
    assert _violations() == [], "ask the family's capabilities (scaleforge.config.capabilities) instead"


@pytest.mark.parametrize(
    "source, expected",
    [
        ('if spec.name == "transformer_lm":\n    pass', [(1, "transformer_lm")]),
        ('ok = "moe" != cfg.model.name', [(1, "moe")]),
        ('lm = spec["name"] in ("mlp", "cnn1d")', [(1, "mlp"), (1, "cnn1d")]),
        ('x = name not in {"moe_gate", "other"}', [(1, "moe_gate")]),
        ('x = name in ["cnn1d_early_exit"]', [(1, "cnn1d_early_exit")]),
        ('match spec.name:\n    case "transformer":\n        pass', [(2, "transformer")]),
        ('x = a == "teacher" or b in ("cascade",)', []),
        ('name = "mlp"\nf(name="cnn1d")', []),
    ],
)
def test_the_rule_reader_sees_every_kind_of_comparison(source, expected):
    """The check above would pass vacuously if comparisons were missed: equality either way round,
    membership in tuples, sets and lists, and match cases count; assignments and other words do not."""
    assert name_comparisons(source) == expected


def test_the_exemptions_cover_only_other_meanings(tmp_path):
    """A model-name comparison in the pipeline is a violation unless the word has another meaning there."""
    assert _within(LIBRARY / "pipeline" / "query.py", OTHER_MEANINGS["moe"])
    assert not _within(LIBRARY / "train" / "loop.py", OTHER_MEANINGS["moe"] + REGISTRY)
    assert set(OTHER_MEANINGS) <= set(MODEL_NAMES)


def test_a_registration_that_contradicts_its_spec_is_refused():
    """``register`` checks the family's code against what its spec claims, before it is used."""
    from pydantic import BaseModel

    from scaleforge.models import MLPSpec, TransformerSpec, model_family, register
    from scaleforge.models.mlp import MLP
    from scaleforge.models.registry import ModelFamily
    from scaleforge.models.transformer import TransformerClassifier

    with pytest.raises(ValueError, match="'transformer': capabilities.splits and its plan disagree on tp"):
        register(ModelFamily(TransformerSpec, TransformerClassifier))  # no plan, yet its spec claims tp
    with pytest.raises(ValueError, match="'mlp' is registered twice"):
        register(ModelFamily(MLPSpec, MLP))

    class Unlisted(BaseModel):
        name: str = "unlisted"

    with pytest.raises(ValueError, match="'unlisted': add its spec to scaleforge.config.models"):
        register(ModelFamily(Unlisted, MLP))
    with pytest.raises(ValueError, match="unknown model 'unlisted'; registered models: mlp, cnn1d"):
        model_family("unlisted")
