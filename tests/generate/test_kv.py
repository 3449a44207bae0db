"""The cached forward pass computes what the model's own forward computes, for every way of feeding it."""

import pytest
import torch

from scaleforge.config.models import TransformerLMSpec
from scaleforge.generate.kv import KVCache, extend
from scaleforge.models.transformer_lm import TransformerLM


@pytest.fixture(scope="module")
def model() -> TransformerLM:
    torch.manual_seed(0)
    spec = TransformerLMSpec(context=32, d_model=32, num_heads=4, num_layers=2, ff_dim=64, dropout=0.0)
    return TransformerLM(spec, input_dim=32, num_classes=256).eval()


def test_prefill_then_steps_match_the_full_forward(model):
    sequence = torch.randint(0, 256, (32,)).tolist()
    reference = model(torch.tensor([sequence]))[0]
    cache = KVCache.allocate(model, slots=3)
    # Slot 1 takes a prompt of 10, then single tokens, then a run of 5 (a drafter's proposals), then the rest.
    logits = extend(model, cache, [1], [sequence[:10]])[0]
    for i in range(10, 14):
        logits = torch.cat([logits, extend(model, cache, [1], [[sequence[i]]])[0]])
    logits = torch.cat([logits, extend(model, cache, [1], [sequence[14:19]])[0]])
    logits = torch.cat([logits, extend(model, cache, [1], [sequence[19:]])[0]])
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=1e-4)
    assert cache.lengths.tolist() == [0, 32, 0]


def test_rows_of_different_lengths_share_a_pass(model):
    """A prompt joining decoding rows (continuous batching): every row as if it ran alone."""
    a, b, c = (torch.randint(0, 256, (n,)).tolist() for n in (20, 7, 32))
    cache = KVCache.allocate(model, slots=4)
    extend(model, cache, [0, 3], [a[:19], c[:31]])
    together = extend(model, cache, [3, 2, 0], [c[31:], b, a[19:]])
    for row, sequence in zip(together, (c, b, a)):
        torch.testing.assert_close(row[-1], model(torch.tensor([sequence]))[0, -1], atol=1e-5, rtol=1e-4)
    assert cache.lengths.tolist() == [20, 0, 7, 32]


def test_a_row_past_the_context_is_refused(model):
    cache = KVCache.allocate(model, slots=1)
    extend(model, cache, [0], [list(range(30))])
    with pytest.raises(ValueError, match="do not fit the context of 32"):
        extend(model, cache, [0], [[1, 2, 3]])


def test_int8_dynamic_model_runs_cached(model):
    """Dynamic quantization scales each pass's activations by their own range, so a token's logits move
    a little with what shares its pass; within 0.02 of the full forward (logits here span about 1)."""
    quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    sequence = torch.randint(0, 256, (16,)).tolist()
    cache = KVCache.allocate(quantized, slots=1)
    logits = torch.cat(
        [extend(quantized, cache, [0], [sequence[:8]])[0]]
        + [extend(quantized, cache, [0], [[t]])[0] for t in sequence[8:]]
    )
    torch.testing.assert_close(logits, quantized(torch.tensor([sequence]))[0], atol=0.02, rtol=0)
