"""Where a job's data comes from: the config section ``data`` (fields only; no file is touched).

Whether the files exist and can be read is the pre-flight's question
(:func:`scaleforge.data.preflight.check_data`): ``source`` may later name storage that only the
cluster reaches, so the schema neither opens nor resolves it.
"""

from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PositiveInt,
    Tag,
    field_validator,
    model_validator,
)

MNIST1D = "mnist1d"
FILE_SUFFIXES = (".npz", ".parquet")


class DataSpec(BaseModel):
    """A dataset: MNIST-1D generated locally, or a user's ``.npz`` / Parquet file with ``x`` and ``y``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["arrays"] = "arrays"
    """Examples as feature rows and labels (``kind: text`` is a :class:`TextDataSpec`)."""
    source: str = MNIST1D
    """``mnist1d``, or the path or URI of a ``.npz`` or ``.parquet`` file holding ``x`` (features) and
    ``y`` (labels)."""
    num_samples: PositiveInt = 20_000
    """MNIST-1D only: examples to generate (train + test)."""
    seed: int = 42
    """Seed of the MNIST-1D generator and of the train/test split of a user's file."""
    test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    """Share of the examples held out for testing (unless ``test_path`` is given)."""
    test_path: Optional[str] = None
    """Optional held-out file in the same format as ``source``; then no split is made."""
    cache_dir: str = "~/.cache/scaleforge"
    """Where generated MNIST-1D is cached (``.npz``, no pickle): a local folder or a URI
    (``s3://bucket/cache``) that every node reads, so that a cluster generates it once."""

    @field_validator("source", "test_path")
    @classmethod
    def _known_format(cls, value: Optional[str], info) -> Optional[str]:
        if value is None or (info.field_name == "source" and value == MNIST1D):
            return value
        if _suffix(value) not in FILE_SUFFIXES:
            raise ValueError(
                f"{value!r} must be '{MNIST1D}' or a file ending in {' or '.join(FILE_SUFFIXES)}"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "DataSpec":
        if self.is_mnist1d and self.test_path is not None:
            raise ValueError("data.test_path applies to a user's file, not to data.source=mnist1d")
        if self.is_mnist1d and self.num_samples < 20:
            raise ValueError(f"data.num_samples ({self.num_samples}) must be at least 20 (2 per class)")
        if self.test_path and _suffix(self.test_path) != _suffix(self.source):
            raise ValueError("data.test_path must have the same format as data.source")
        return self

    @property
    def is_mnist1d(self) -> bool:
        return self.source == MNIST1D

    @property
    def suffix(self) -> str:
        """The file format, ``.npz`` or ``.parquet`` (empty for MNIST-1D)."""
        return "" if self.is_mnist1d else _suffix(self.source)

    @property
    def files(self) -> list[str]:
        """The files this spec reads, as written (none for MNIST-1D)."""
        return [p for p in (None if self.is_mnist1d else self.source, self.test_path) if p]


class TextDataSpec(BaseModel):
    """Text for a language model (``kind: text``): the running interpreter's standard library, or a
    folder of the user's own text files, split by file and cut into windows of ``seq_len`` tokens."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["text"] = "text"
    """Marks a text section (a ``data`` section without ``kind`` holds arrays)."""
    source: str = "stdlib"
    """``stdlib`` (the ``.py`` files of the interpreter's standard library, without tests and
    installed packages), a folder whose UTF-8 files are the corpus, or a ``.parquet`` file with one
    document per row."""
    column: str = "text"
    """Parquet only: the string column holding the documents."""
    seq_len: PositiveInt = 128
    """Tokens per training window; the model predicts each token from the ones before it."""
    validation_fraction: float = Field(default=0.05, gt=0.0, lt=1.0)
    """Share of the files held out for validation, chosen by a hash of each file's path."""
    tokenizer: Literal["bytes", "bpe"] = "bytes"
    """``bytes``: UTF-8 bytes as tokens (vocabulary 256, nothing to train); ``bpe``: a byte-level BPE
    (Hugging Face ``tokenizers``) trained on the training bytes, stored in the artifact as JSON. Bits
    per byte are reported per byte of text either way."""
    vocab_size: Optional[int] = Field(default=None, ge=257, le=65536)
    """``bpe`` only: ids in its vocabulary, the 256 bytes and ``vocab_size - 256`` merges (default 4096)."""
    max_train_bytes: Optional[PositiveInt] = None
    """Train on the first this many bytes of the training split only (small runs and tests)."""
    max_validation_bytes: Optional[PositiveInt] = None
    """Validate on the first this many bytes of the validation split only."""

    @model_validator(mode="after")
    def _vocabulary_of_its_tokenizer(self) -> "TextDataSpec":
        if self.vocab_size is not None and self.tokenizer == "bytes":
            raise ValueError("data.vocab_size is the size of a trained vocabulary: set data.tokenizer=bpe")
        return self

    @property
    def vocabulary(self) -> int:
        """Token ids the model predicts: 256 bytes, or the BPE's ``vocab_size``."""
        return 256 if self.tokenizer == "bytes" else self.vocab_size or 4096


def _data_kind(value: Any) -> str:
    return value.get("kind", "arrays") if isinstance(value, dict) else getattr(value, "kind", "arrays")


TrainDataSpec = Annotated[
    Union[Annotated[DataSpec, Tag("arrays")], Annotated[TextDataSpec, Tag("text")]], Discriminator(_data_kind)
]
"""A training job's ``data``: arrays (:class:`DataSpec`) or, with ``kind: text``, text
(:class:`TextDataSpec`)."""


def _suffix(path: str) -> str:
    return PurePosixPath(
        path.partition("?")[0]
    ).suffix  # a URI's query (``?endpoint_override=...``) is not the name
