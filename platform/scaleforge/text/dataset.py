"""A text corpus as Ray Datasets of token windows, the rows a language model trains on.

Each split's files are concatenated, tokenized and cut into windows of ``seq_len + 1`` tokens that
overlap by one: row ``i`` holds ``x`` = tokens ``[i * seq_len, (i + 1) * seq_len)`` and ``y`` = the
same positions shifted by one, so every token of the split is predicted exactly once. The driver
reads the corpus once into Ray's object store; Ray Train hands each data-parallel rank its own
shard of the windows, so no worker holds the whole corpus.
"""

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import numpy as np

from scaleforge.config.data import TextDataSpec
from scaleforge.data.sources import DatasetInfo
from scaleforge.storage import node_cache, write_atomic
from scaleforge.text.corpus import Corpus, load_corpus
from scaleforge.text.tokenizer import BPETokenizer, ByteTokenizer, tokenizer_from_json, train_bpe

if TYPE_CHECKING:
    import ray.data


@dataclass(frozen=True)
class TextSplits:
    """A corpus read, tokenized and cut into windows: what the datasets and the manifest need."""

    train: tuple[np.ndarray, np.ndarray]
    validation: tuple[np.ndarray, np.ndarray]
    info: DatasetInfo
    fingerprint: str
    tokenizer: Union[ByteTokenizer, BPETokenizer]


def windows(tokens: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``, each ``[windows, seq_len]``: consecutive windows and their next tokens."""
    count = (len(tokens) - 1) // seq_len
    if count < 1:
        raise ValueError(f"{len(tokens)} tokens do not fill one window of {seq_len} + 1")
    x = tokens[: count * seq_len].reshape(count, seq_len)
    y = tokens[1 : count * seq_len + 1].reshape(count, seq_len)
    return x, y


def window_counts(spec: TextDataSpec, corpus: Corpus) -> tuple[int, int]:
    """Training and validation windows of ``corpus`` under ``spec``, from file sizes alone: exact for byte
    tokens, an upper bound for BPE (whose tokens are each a byte or more)."""
    sizes = (
        _capped(corpus.train_bytes, spec.max_train_bytes),
        _capped(corpus.validation_bytes, spec.max_validation_bytes),
    )
    return tuple(max(0, (size - 1) // spec.seq_len) for size in sizes)


def describe_text(spec: TextDataSpec, corpus: Corpus) -> DatasetInfo:
    """The dataset's shape without reading a byte of text (window counts: see :func:`window_counts`)."""
    num_train, num_validation = window_counts(spec, corpus)
    return DatasetInfo(num_train, num_validation, spec.seq_len, spec.vocabulary, tokens=True)


def read_text(spec: TextDataSpec, tokenizer: Union[ByteTokenizer, BPETokenizer, None] = None) -> TextSplits:
    """Read, tokenize and window both splits of ``spec``'s corpus with ``tokenizer`` (a trained model's
    own), else ``spec``'s: a BPE is trained on the training bytes read (or found in the cache, trained on
    the same bytes before). Bits per byte divide by the validation split's bytes per token."""
    corpus = load_corpus(spec.source, spec.validation_fraction, spec.column)
    train_bytes = corpus.read("train")[: spec.max_train_bytes]
    validation_bytes = corpus.read("validation")[: spec.max_validation_bytes]
    tokenizer = tokenizer or text_tokenizer(spec, train_bytes)
    train, validation = tokenizer.encode(train_bytes), tokenizer.encode(validation_bytes)
    train_windows, validation_windows = windows(train, spec.seq_len), windows(validation, spec.seq_len)
    info = DatasetInfo(
        len(train_windows[0]),
        len(validation_windows[0]),
        spec.seq_len,
        tokenizer.vocab_size,
        tokens=True,
        bytes_per_token=len(validation_bytes) / len(validation),
    )
    return TextSplits(train_windows, validation_windows, info, corpus.fingerprint(), tokenizer)


def text_tokenizer(spec: TextDataSpec, train_bytes: bytes) -> Union[ByteTokenizer, BPETokenizer]:
    """``spec``'s tokenizer: bytes, or a BPE of ``data.vocab_size`` trained on ``train_bytes``, kept as
    JSON in ``$SCALEFORGE_CACHE/tokenizers`` (``~/.cache/scaleforge``) under the digest of those bytes."""
    if spec.tokenizer == "bytes":
        return ByteTokenizer()
    import tokenizers

    recipe = f"\0bpe {spec.vocabulary} {tokenizers.__version__}".encode()
    key = hashlib.sha256(train_bytes + recipe).hexdigest()
    path = node_cache() / "tokenizers" / f"{key}.json"
    if path.is_file():
        return tokenizer_from_json(json.loads(path.read_text()))
    tokenizer = train_bpe(train_bytes, spec.vocabulary)
    write_atomic(path, json.dumps(tokenizer.to_json()))
    return tokenizer


def text_datasets(splits: TextSplits) -> "dict[str, ray.data.Dataset]":
    """``train`` and ``test`` (the validation windows) Ray Datasets with columns ``x`` and ``y``."""
    import pyarrow as pa
    import ray.data  # here, not at the top: a parameter-server actor reads text windows without Ray Data
    from ray.data.extensions import ArrowTensorArray

    return {
        name: ray.data.from_arrow(
            pa.table({"x": ArrowTensorArray.from_numpy(x), "y": ArrowTensorArray.from_numpy(y)})
        )
        for name, (x, y) in (("train", splits.train), ("test", splits.validation))
    }


def _capped(size: int, cap) -> int:
    return size if cap is None else min(size, cap)
