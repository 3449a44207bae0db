"""A language-model artifact exported to the Hugging Face format: ``transformers`` loads it and scores the
same validation text as ours (within 1e-4 bits/byte), its tokenizer gives our byte ids, and what GPT-2's
format cannot hold is refused by name."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, GPT2LMHeadModel

from scaleforge.artifacts import save_artifact
from scaleforge.artifacts.hf import export_hf, main
from scaleforge.config.models import TransformerLMSpec
from scaleforge.models import build_model
from scaleforge.quickfit import bits_per_byte, fit
from scaleforge.text.corpus import load_corpus
from scaleforge.text.dataset import windows
from scaleforge.text.tokenizer import ByteTokenizer

SPEC = TransformerLMSpec(context=64, d_model=32, num_heads=4, num_layers=2, ff_dim=64, dropout=0.0)


@pytest.fixture(scope="module")
def text() -> tuple[np.ndarray, np.ndarray]:
    corpus = load_corpus("stdlib")
    return tuple(
        np.frombuffer(corpus.read(split)[:size], np.uint8).astype(np.int64)
        for split, size in (("train", 60_000), ("validation", 20_000))
    )


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, text) -> str:
    torch.manual_seed(0)
    train, _ = text
    model = fit(build_model(SPEC, 64, 256), *windows(train, 64), epochs=1, batch_size=32, lr=3e-3)
    folder = tmp_path_factory.mktemp("lm") / "lm"
    return str(
        save_artifact(
            folder, model, SPEC, input_dim=64, num_classes=256, extra={"tokenizer": ByteTokenizer().to_json()}
        )
    )


def test_transformers_scores_the_same_text_as_ours(artifact, text, tmp_path):
    from scaleforge.artifacts.store import load_model

    assert main([artifact, str(tmp_path / "hf")]) == 0
    x, y = windows(text[1], 64)
    ours = bits_per_byte(load_model(artifact), x, y)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    with torch.inference_mode():
        logits = hf(torch.as_tensor(x)).logits
    theirs = F.cross_entropy(logits.flatten(0, 1), torch.as_tensor(y).flatten()).item() / math.log(2)
    assert abs(ours - theirs) < 1e-4, (ours, theirs)
    assert ours < 6.0  # it learned something: uniform bytes score 8
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    sample = "def héllo():\n\treturn 'ok' ✓"
    assert tokenizer(sample)["input_ids"] == list(sample.encode())
    assert tokenizer.decode(list(sample.encode())) == sample


def test_what_gpt2_cannot_hold_is_refused(artifact, tmp_path):
    quantized = torch.ao.quantization.quantize_dynamic(build_model(SPEC, 64, 256).eval(), {torch.nn.Linear})
    folder = save_artifact(
        tmp_path / "q",
        quantized,
        SPEC,
        input_dim=64,
        num_classes=256,
        architecture=[{"op": "quantize", "scheme": "int8_dynamic"}],
    )
    with pytest.raises(ValueError, match="only a dense, float transformer_lm exports .* compressed"):
        export_hf(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()
