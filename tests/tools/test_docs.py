"""The documentation stays true: a short front page, paths that exist, a config reference that matches the schemas."""

import difflib
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from conftest import REPO
from scaleforge.config.reference import render


def test_the_config_reference_matches_the_schemas():
    committed, fresh = (REPO / "docs/config.md").read_text(), render()
    diff = "\n".join(list(difflib.unified_diff(committed.splitlines(), fresh.splitlines(), "docs/config.md",
                                               "the schemas", lineterm=""))[:20])
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
    assert "| `fruit` | one of [`apple`](#jobs-basket-fruit-apple), [`pear`](#jobs-basket-fruit-pear) (chosen by `kind`) | `pear` |" in text
    assert "| `extras` | non-empty list of [`_Base`](#jobs-basket-extras) | `[]` | More of the base. |" in text
    assert "| `weight` | `float` >= 0 or null | `null` |  |" in text
    assert "| `fruit.size` | `int` > 0 | `3` | Base size. |" in text  # docstrings found in the base class
    assert "| `fruit.label` | `str` | `apple` | The apple's own label. |" in text  # the subclass's own wins
    assert "| `fruit.kind` | `pear` | `pear` | Which fruit. |" in text
    assert "| `extras.<i>.label` | `str` | `base` | Base label. |" in text
