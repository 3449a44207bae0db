"""Real text for language models, with nothing to download: a corpus split by file, a byte tokenizer,
and what general-purpose compressors achieve on the same bytes (the baseline a model must beat)."""

from scaleforge.text.corpus import STDLIB, Corpus, CorpusError, TextFile, in_validation, load_corpus
from scaleforge.text.tokenizer import ByteTokenizer, compressed_bits_per_byte

__all__ = [
    "STDLIB",
    "ByteTokenizer",
    "Corpus",
    "CorpusError",
    "TextFile",
    "compressed_bits_per_byte",
    "in_validation",
    "load_corpus",
]
