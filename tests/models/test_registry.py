"""The model registry builds every family at the sizes a config asks for."""

import pytest
import torch
from pydantic import ValidationError

from scaleforge.config.models import capabilities_of
from scaleforge.distributed.strategy import Batch
from scaleforge.models import (
    MODEL_NAMES,
    MODEL_SPEC,
    CNN1dSpec,
    TransformerSpec,
    build_model,
    count_parameters,
    model_family,
)

CLASSIFIERS = [name for name in MODEL_NAMES if not capabilities_of(name).language_model]


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_every_registered_model_classifies_a_batch(name):
    """Every parameter learns from what the trainer minimises: the logits' loss plus the family's own."""
    extra = {"num_experts": 10} if name == "moe_gate" else {}  # a gate's outputs are its experts
    model = build_model(MODEL_SPEC.validate_python({"name": name, **extra}), input_dim=40, num_classes=10)
    x, y = torch.randn(5, 40), torch.randint(0, 10, (5,))
    logits = model(x)
    assert logits.shape == (5, 10)
    (logits.sum() + model_family(name).auxiliary_loss(model, Batch(x, y))).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_the_language_model_predicts_every_next_token_from_the_ones_before_it():
    model = build_model(
        MODEL_SPEC.validate_python({"name": "transformer_lm", "context": 64}), input_dim=40, num_classes=256
    ).eval()  # no dropout: two forwards compare exactly
    tokens = torch.randint(0, 256, (5, 40))
    logits = model(tokens)
    assert logits.shape == (5, 40, 256)
    changed = tokens.clone()
    changed[:, 20] = (changed[:, 20] + 1) % 256
    after = model(changed)
    torch.testing.assert_close(after[:, :20], logits[:, :20])  # causal: no position sees a later token
    assert not torch.allclose(after[:, 20:], logits[:, 20:])
    assert model.head is None and not any(
        name.startswith("head") for name, _ in model.named_parameters()
    )  # tied
    with pytest.raises(
        ValueError, match=r"sequence length 80 \(data.seq_len\) is above model.context \(64\)"
    ):
        build_model(MODEL_SPEC.validate_python({"name": "transformer_lm", "context": 64}), 80, 256)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_sizes_come_from_the_spec():
    small = build_model(CNN1dSpec(channels=[8], hidden=16), 40, 10)
    large = build_model(CNN1dSpec(channels=[64, 128, 128], pool=True, hidden=256), 40, 10)
    assert count_parameters(small) == 8 * 5 + 8 + 2 * 8 + 8 * 40 * 16 + 16 + 16 * 10 + 10
    assert count_parameters(large) > 250_000


def test_architecture_errors_are_explicit():
    with pytest.raises(ValidationError, match="must be divisible by model.num_heads"):
        TransformerSpec(d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="not divisible by patch_size 3"):
        build_model(TransformerSpec(patch_size=3), 40, 10)
    with pytest.raises(ValueError, match="shrinks to 0"):
        build_model(CNN1dSpec(channels=[4] * 8, pool=True), 40, 10)


def test_transformer_attends_over_patches():
    model = build_model(TransformerSpec(patch_size=4, d_model=32, num_heads=4), 40, 10).eval()
    assert model.position.shape == (1, 10, 32)
    x = torch.randn(3, 40)
    # Each input's prediction is independent of the others in its batch.
    torch.testing.assert_close(model(x)[1:2], model(x[1:2]))
