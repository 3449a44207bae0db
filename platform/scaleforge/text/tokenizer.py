"""Tokens of text: its bytes (a vocabulary of 256, nothing to train), or a byte-level BPE trained on the
training split; and the compressors' baseline.

A model's cross-entropy in bits per token is its bits per byte under byte tokens; under BPE it is
divided by the bytes per token of the text scored. ``gzip -9`` and ``xz -9e`` on the same bytes say
what a general-purpose compressor achieves (a language model that does not beat gzip has learnt little).
"""

import gzip
import json
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


class BPETokenizer:
    """Byte-level BPE (Hugging Face ``tokenizers``, GPT-2's pre-tokenizer): ids 0..255 are the 256 bytes,
    as under :class:`ByteTokenizer`, and every id above stands for the bytes of a learnt merge, so any
    byte string has tokens and every token has bytes."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        byte_of = {char: byte for byte, char in enumerate(byte_chars())}
        pieces = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
        if [index for _, index in pieces] != list(range(self.vocab_size)):
            raise ValueError("a BPE vocabulary whose ids are not 0..vocab_size-1")
        self._bytes = [bytes(byte_of[char] for char in piece) for piece, _ in pieces]

    def encode(self, text: Union[str, bytes]) -> np.ndarray:
        """Token ids (uint16 for vocabularies up to 65,536). Long text is cut after a newline into pieces
        of about 64 kB, encoded in parallel; bytes that are not UTF-8 are read as U+FFFD."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        dtype = np.uint16 if self.vocab_size <= 2**16 else np.int32
        pieces = [encoding.ids for encoding in self.tokenizer.encode_batch(_pieces(text))]
        return np.fromiter((i for ids in pieces for i in ids), dtype=dtype)

    def decode(self, tokens) -> str:
        return self.to_bytes(tokens).decode("utf-8", errors="replace")

    def to_bytes(self, tokens) -> bytes:
        """The bytes that ``tokens`` stand for (text decoded incrementally keeps characters whole)."""
        return b"".join(self._bytes[int(t)] for t in tokens)

    def to_json(self) -> dict:
        """What an artifact's manifest records to rebuild the tokenizer: its vocabulary and merges, JSON."""
        recorded = json.loads(self.tokenizer.to_str())
        return {"type": "bpe", "vocab_size": self.vocab_size, "tokenizer": recorded}


def train_bpe(text: bytes, vocab_size: int) -> BPETokenizer:
    """A byte-level BPE of ``vocab_size`` ids (the 256 bytes, then ``vocab_size - 256`` merges) trained
    on ``text`` with ``tokenizers``' trainer (Rust, every core)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    learner.train_from_iterator(_pieces(text.decode("utf-8", errors="replace")), trainer)
    learnt = json.loads(learner.to_str())["model"]
    vocab = {char: byte for byte, char in enumerate(byte_chars())}  # the bytes keep their byte ids
    for piece, _ in sorted(learnt["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in learnt["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return BPETokenizer(tokenizer)


def _pieces(text: str, size: int = 1 << 16) -> list[str]:
    """``text`` cut after the first newline past every ``size`` characters (whole lines per piece)."""
    pieces, start = [], 0
    while start < len(text):
        cut = text.find("\n", start + size)
        end = len(text) if cut < 0 else cut + 1
        pieces.append(text[start:end])
        start = end
    return pieces


def byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255 (the byte-level pre-tokenizer's alphabet)."""
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def tokenizer_from_json(recorded: dict) -> Union[ByteTokenizer, BPETokenizer]:
    """The tokenizer a manifest records (its ``tokenizer``); ValueError for a kind this build lacks."""
    kind = recorded.get("type")
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "bpe":
        from tokenizers import Tokenizer

        return BPETokenizer(Tokenizer.from_str(json.dumps(recorded["tokenizer"])))
    raise ValueError(f"tokenizer of type {kind!r}: this build reads 'bytes' and 'bpe' tokenizers")


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
