"""``data.tokenizer: bpe``: a byte-level BPE trained on the training bytes with Hugging Face ``tokenizers``,
whose ids 0..255 stay the bytes, recorded as JSON (never pickled) and rebuilt from it to the same ids;
a job reads it from the cache the second time; a vocabulary size without BPE is refused by name."""

import json

import pytest
from conftest import REPO

from scaleforge.config import TrainJobConfig, load_config
from scaleforge.config.loader import ConfigError
from scaleforge.text.corpus import load_corpus
from scaleforge.text.dataset import read_text
from scaleforge.text.tokenizer import ByteTokenizer, tokenizer_from_json, train_bpe

VOCAB = 512


@pytest.fixture(scope="module")
def corpus():
    stdlib = load_corpus()
    return stdlib.read("train")[:200_000], stdlib.read("validation")[:50_000]


@pytest.fixture(scope="module")
def bpe(corpus):
    return train_bpe(corpus[0], VOCAB)


def test_bpe_tokens_are_shorter_than_bytes_and_decode_to_the_same_bytes(bpe, corpus):
    _, validation = corpus
    tokens = bpe.encode(validation)
    assert bpe.vocab_size == VOCAB and int(tokens.max()) < VOCAB
    assert bpe.to_bytes(tokens) == validation and bpe.decode(tokens) == validation.decode()
    print(f"{len(validation) / len(tokens):.2f} bytes per token on held-out files, vocabulary {VOCAB}")
    assert len(validation) / len(tokens) > 1.5  # merges learnt on other files still apply
    # The bytes keep the ids byte tokens give them, so every byte string has tokens.
    assert [bpe.to_bytes([b]) for b in range(256)] == [bytes([b]) for b in range(256)]
    assert bpe.encode("\x00\x7f").tolist() == ByteTokenizer().encode("\x00\x7f").tolist()


def test_bpe_is_recorded_as_json_and_rebuilt_to_the_same_ids(bpe, corpus):
    recorded = json.loads(json.dumps(bpe.to_json()))  # what a manifest holds
    assert recorded["type"] == "bpe" and recorded["vocab_size"] == VOCAB
    rebuilt = tokenizer_from_json(recorded)
    sample = corpus[1][:20_000]
    assert rebuilt.encode(sample).tolist() == bpe.encode(sample).tolist()
    # The Hugging Face tokenizer inside (what the GPT-2 export writes) gives the same ids.
    assert rebuilt.tokenizer.encode(sample.decode()).ids == bpe.encode(sample).tolist()
    with pytest.raises(ValueError, match="'sentencepiece': this build reads 'bytes' and 'bpe'"):
        tokenizer_from_json({"type": "sentencepiece"})


def test_a_job_trains_its_bpe_once_and_reports_bytes_per_token(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEFORGE_CACHE", str(tmp_path / "cache"))
    cfg = load_config(
        TrainJobConfig,
        REPO / "configs/train_lm_tiny.yaml",
        ["data.tokenizer=bpe", f"data.vocab_size={VOCAB}", "data.max_train_bytes=100000"],
    )
    first = read_text(cfg.data)
    assert [p.suffix for p in (tmp_path / "cache" / "tokenizers").iterdir()] == [".json"]
    again = read_text(cfg.data)  # from the cache: the same tokenizer, so the same windows
    assert (again.train[0] == first.train[0]).all() and again.tokenizer.to_json() == first.tokenizer.to_json()
    assert first.info.num_classes == VOCAB and first.info.bytes_per_token > 1.5
    assert first.train[0].shape[1] == cfg.data.seq_len


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.vocab_size=1024"], "data.vocab_size is the size of a trained vocabulary: set data.tokenizer"),
        (["data.tokenizer=bpe", "data.vocab_size=100"], "greater than or equal to 257"),
    ],
)
def test_a_vocabulary_size_that_cannot_be_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(TrainJobConfig, REPO / "configs/train_lm_tiny.yaml", overrides)


def test_the_hugging_face_export_carries_the_bpe_and_its_ids(bpe, corpus, tmp_path):
    from transformers import AutoTokenizer

    from scaleforge.artifacts import save_artifact
    from scaleforge.artifacts.hf import export_hf
    from scaleforge.config.models import TransformerLMSpec
    from scaleforge.models import build_model

    spec = TransformerLMSpec(context=32, d_model=16, num_heads=2, num_layers=1, ff_dim=32, dropout=0.0)
    folder = save_artifact(
        tmp_path / "lm",
        build_model(spec, 32, VOCAB),
        spec,
        input_dim=32,
        num_classes=VOCAB,
        extra={"tokenizer": bpe.to_json()},
    )
    exported = AutoTokenizer.from_pretrained(export_hf(folder, tmp_path / "hf"))
    sample = corpus[1][:2_000].decode()
    assert exported(sample)["input_ids"] == bpe.encode(sample).tolist()
    assert exported.decode(bpe.encode(sample).tolist()) == sample
