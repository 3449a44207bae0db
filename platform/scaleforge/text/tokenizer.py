"""Byte-level tokens (a vocabulary of 256, nothing to train or download), and the compressors' baseline.

A model's cross-entropy in bits per token is its bits per byte under byte tokens; ``gzip -9`` and
``xz -9e`` on the same bytes say what a general-purpose compressor achieves (a language model that
does not beat gzip has learnt little).
"""

import gzip
import lzma
from typing import Union

import numpy as np


class ByteTokenizer:
    """Text as its UTF-8 bytes: token ``i`` is the byte ``i``."""

    vocab_size = 256

    def encode(self, text: Union[str, bytes]) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else text
        return np.frombuffer(data, dtype=np.uint8).copy()

    def decode(self, tokens) -> str:
        return bytes(np.asarray(tokens, dtype=np.uint8)).decode("utf-8", errors="replace")

    def to_bytes(self, tokens) -> bytes:
        """The bytes that ``tokens`` stand for (text decoded incrementally keeps characters whole)."""
        return bytes(tokens)

    def to_json(self) -> dict:
        """What an artifact's manifest records to rebuild the tokenizer (JSON, no pickle)."""
        return {"type": "bytes", "vocab_size": self.vocab_size}


def tokenizer_from_json(recorded: dict) -> ByteTokenizer:
    """The tokenizer a manifest records (its ``tokenizer``); ValueError for a kind this build lacks."""
    if recorded.get("type") != "bytes":
        raise ValueError(f"tokenizer {recorded!r}: this build reads only byte tokenizers ('type': 'bytes')")
    return ByteTokenizer()


COMPRESSORS = {
    "gzip -9": lambda data: gzip.compress(data, compresslevel=9),
    "xz -9e": lambda data: lzma.compress(data, preset=9 | lzma.PRESET_EXTREME),
}


def unigram_bits_per_byte(data: bytes) -> float:
    """The entropy of ``data``'s byte frequencies, in bits per byte: what the best model that ignores
    context scores on the bytes it was fitted to. A language model that learned anything beats it."""
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
    shares = counts[counts > 0] / counts.sum()
    return float(-(shares * np.log2(shares)).sum())


def compressed_bits_per_byte(data: bytes, compressor: str) -> float:
    """Bits per byte of ``data`` compressed as one stream by ``compressor`` (a key of ``COMPRESSORS``)."""
    if not data:
        raise ValueError("no bytes to compress")
    return 8 * len(COMPRESSORS[compressor](data)) / len(data)
