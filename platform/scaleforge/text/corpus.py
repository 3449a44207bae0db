"""A text corpus split by file: the running interpreter's standard library, or a folder of the user's own.

The default corpus (``stdlib``) is the ``.py`` files of ``sysconfig.get_paths()["stdlib"]``, leaving
out ``site-packages``, ``test``/``tests``, ``__pycache__``, ``idlelib`` and ``lib2to3``: real code,
about 11 MB in 600 files on CPython 3.11. A file goes to validation when a hash of its relative path
falls below ``validation_fraction``, so the split is the same on every machine and in every run, and
no file straddles it. The fingerprint (sha256 over every file's relative path and bytes) goes into
the manifest of a model trained on it.
"""

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pyarrow import types as pa_types

STDLIB = "stdlib"
"""``source`` of the standard-library corpus."""

EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "__pycache__", "idlelib", "lib2to3"})
"""Folders of the standard library left out: installed packages, test suites, caches, and two
packages of unusual code."""


class CorpusError(ValueError):
    """A corpus that cannot be used: the message names the folder and what is wrong."""


@dataclass(frozen=True)
class TextFile:
    relative: str
    """Path under the corpus root, or ``row <i>`` of a Parquet file (what the split hashes)."""
    path: str
    size: int
    text: Optional[bytes] = None
    """The document itself, for a Parquet row (a file is read when needed)."""

    def read(self) -> bytes:
        return self.text if self.text is not None else Path(self.path).read_bytes()


@dataclass(frozen=True)
class Corpus:
    """A corpus's files, split by file into training and validation."""

    root: str
    train: tuple[TextFile, ...]
    validation: tuple[TextFile, ...]

    @property
    def train_bytes(self) -> int:
        return sum(f.size for f in self.train)

    @property
    def validation_bytes(self) -> int:
        return sum(f.size for f in self.validation)

    def fingerprint(self) -> str:
        """sha256 over every file's relative path and bytes, in order (reads the whole corpus)."""
        digest = hashlib.sha256()
        for text in (*self.train, *self.validation):
            digest.update(text.relative.encode() + b"\0" + text.read())
        return "sha256:" + digest.hexdigest()

    def read(self, split: str) -> bytes:
        """The bytes of every file of ``split`` (``train`` or ``validation``), concatenated in order."""
        return b"".join(text.read() for text in getattr(self, split))


def in_validation(relative: str, fraction: float) -> bool:
    """Whether the file at ``relative`` is a validation file (the first 8 bytes of its path's sha256,
    as a fraction of 2**64, fall below ``fraction``)."""
    return int.from_bytes(hashlib.sha256(relative.encode()).digest()[:8], "big") / 2**64 < fraction


def load_corpus(source: str = STDLIB, validation_fraction: float = 0.05, column: str = "text") -> Corpus:
    """The files of ``source`` (``stdlib``, a folder whose every UTF-8 file is text, or a ``.parquet``
    file whose ``column`` holds one document per row), split by file (or row).

    Raises:
        CorpusError: the folder or file does not exist, holds no text, or its split leaves one side empty.
    """
    if source == STDLIB:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = _walk(root, lambda path: path.suffix == ".py", EXCLUDED_DIRS)
    elif source.endswith(".parquet"):
        root, files = Path(source).expanduser(), _documents(Path(source).expanduser(), column)
    else:
        root = Path(source).expanduser()
        if not root.is_dir():
            raise CorpusError(f"corpus folder {source!r} does not exist")
        files = _walk(root, _is_text, frozenset({"__pycache__", ".git"}))
    if not files:
        raise CorpusError(f"corpus folder {source!r} holds no text files (UTF-8, not empty)")
    train = tuple(f for f in files if not in_validation(f.relative, validation_fraction))
    validation = tuple(f for f in files if in_validation(f.relative, validation_fraction))
    if not train or not validation:
        empty = "training" if not train else "validation"
        raise CorpusError(
            f"corpus {source!r}: its {len(files)} file(s) leave the {empty} split empty at "
            f"validation_fraction={validation_fraction}; add files or change the fraction"
        )
    return Corpus(str(root), train, validation)


def _walk(root: Path, keep, excluded: frozenset) -> list[TextFile]:
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in excluded)
        for name in sorted(names):
            path = Path(folder) / name
            if path.is_file() and keep(path) and (size := path.stat().st_size) > 0:
                found.append(TextFile(path.relative_to(root).as_posix(), str(path), size))
    return found


def _documents(path: Path, column: str) -> list[TextFile]:
    """Every non-empty row of ``column`` of a Parquet file, as a document named by its row."""
    import pyarrow.parquet as pq

    if not path.is_file():
        raise CorpusError(f"corpus file {str(path)!r} does not exist")
    schema = pq.read_schema(path)
    if column not in schema.names or not (
        pa_types.is_string(schema.field(column).type) or pa_types.is_large_string(schema.field(column).type)
    ):
        raise CorpusError(
            f"corpus file {str(path)!r} has no text column {column!r} "
            f"(its columns: {', '.join(schema.names)}); set data.column"
        )
    rows = pq.read_table(path, columns=[column]).column(column).to_pylist()
    return [
        TextFile(f"row {i}", str(path), len(data), data)
        for i, row in enumerate(rows)
        if row and (data := row.encode("utf-8"))
    ]


def _is_text(path: Path) -> bool:
    try:
        path.read_bytes().decode("utf-8")
    except (UnicodeDecodeError, OSError):
        return False
    return True
