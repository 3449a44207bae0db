"""Read a :class:`DataSpec` into arrays (MNIST-1D, ``.npz``) or Ray Datasets (Parquet)."""

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import PurePosixPath

import numpy as np
import pyarrow.parquet as pq

from scaleforge import storage
from scaleforge.config.data import DataSpec
from scaleforge.data.mnist1d import NUM_CLASSES, SEQUENCE_LENGTH, load_mnist1d, split_sizes
from scaleforge.text.corpus import STDLIB


@dataclass(frozen=True)
class DatasetInfo:
    """Shape of a dataset, known before any training resource is allocated."""

    num_train: int
    num_test: int
    input_dim: int
    """Features per example; a language model's sequence length."""
    num_classes: int
    """Classes; a language model's vocabulary."""
    tokens: bool = False
    """``x`` holds token ids and ``y`` the next token at every position (a language model's data)."""
    bytes_per_token: float = 1.0
    """Text bytes per token (1 for byte tokens): converts loss per token into bits per byte."""


@dataclass(frozen=True)
class ArraySplits:
    """A dataset held in memory: train and test arrays plus a fingerprint of their bytes."""

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for array in (self.x, self.y, self.x_test, self.y_test):
            digest.update(np.ascontiguousarray(array).tobytes())
        return "sha256:" + digest.hexdigest()

    @property
    def info(self) -> DatasetInfo:
        num_classes = int(max(self.y.max(), self.y_test.max())) + 1
        return DatasetInfo(len(self.y), len(self.y_test), int(self.x.shape[1]), num_classes)


def localized(spec: DataSpec) -> DataSpec:
    """``spec`` with its local files as absolute paths (``~`` expanded), read the same from any process;
    URIs stay as they are (every node reads them from storage).

    The schema keeps paths as written; this is done where the files are read, and before a spec
    is handed to a Ray task whose working directory may differ.
    """
    if spec.kind == "text":
        return (
            spec
            if spec.source == STDLIB
            else spec.model_copy(update={"source": os.path.abspath(os.path.expanduser(spec.source))})
        )
    if spec.is_mnist1d:
        return spec
    local = {
        name: os.path.abspath(os.path.expanduser(path))
        for name in ("source", "test_path")
        if (path := getattr(spec, name)) and not storage.is_uri(path)
    }
    return spec.model_copy(update=local)


def _parquet(location: str) -> pq.ParquetFile:
    filesystem, path = storage.resolve(location)
    return pq.ParquetFile(path, filesystem=filesystem)


def describe(spec: DataSpec) -> DatasetInfo:
    """Sizes of ``spec``'s dataset, cheaply (Parquet: metadata and the label column only)."""
    spec = localized(spec)
    if spec.is_mnist1d:
        train, test = split_sizes(spec.num_samples, spec.test_fraction)
        return DatasetInfo(train, test, SEQUENCE_LENGTH, NUM_CLASSES)
    if not is_parquet(spec):
        return load_arrays(spec).info
    source = _parquet(spec.source)
    rows = source.metadata.num_rows
    labels = source.read(columns=["y"]).column("y").to_numpy()
    first = source.iter_batches(batch_size=1, columns=["x"])
    input_dim = len(_as_matrix(next(first).column("x").to_numpy(zero_copy_only=False))[0])
    if spec.test_path:
        test_rows = _parquet(spec.test_path).metadata.num_rows
        return DatasetInfo(rows, test_rows, input_dim, int(labels.max()) + 1)
    test_rows = max(1, int(round(rows * spec.test_fraction)))
    return DatasetInfo(rows - test_rows, test_rows, input_dim, int(labels.max()) + 1)


def load_arrays(spec: DataSpec) -> ArraySplits:
    """MNIST-1D or a ``.npz`` file as in-memory train/test arrays.

    Raises:
        ValueError: the file lacks ``x``/``y``, or they have the wrong shapes or non-finite values.
    """
    spec = localized(spec)
    if spec.is_mnist1d:
        return ArraySplits(**load_mnist1d(spec.num_samples, spec.seed, spec.test_fraction, spec.cache_dir))
    x, y = _read_npz(spec.source)
    if spec.test_path:
        x_test, y_test = _read_npz(spec.test_path)
        return ArraySplits(x, y, x_test, y_test)
    order = np.random.default_rng(spec.seed).permutation(len(y))
    num_test = max(1, int(round(len(y) * spec.test_fraction)))
    test, train = order[:num_test], order[num_test:]
    return ArraySplits(x[train], y[train], x[test], y[test])


def file_fingerprint(*paths: str) -> str:
    """sha256 over the bytes of ``paths`` (local files or URIs), read in chunks."""
    digest = hashlib.sha256()
    for path in paths:
        filesystem, inner = storage.resolve(path)
        with filesystem.open_input_stream(inner) as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _read_npz(path: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(
        io.BytesIO(storage.read_bytes(path)) if storage.is_uri(path) else path, allow_pickle=False
    ) as stored:
        missing = {"x", "y"} - set(stored.files)
        if missing:
            raise ValueError(f"{path}: missing array(s) {sorted(missing)}; an .npz dataset needs 'x' and 'y'")
        x, y = stored["x"], stored["y"]
    return _checked(path, x, y)


def _checked(path: str, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim != 2:
        raise ValueError(f"{path}: 'x' must be 2-D [examples, features], got shape {x.shape}")
    if y.ndim != 1 or len(y) != len(x):
        raise ValueError(f"{path}: 'y' must be 1-D with one label per row of 'x', got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise ValueError(f"{path}: 'y' must hold non-negative integer class labels, got {y.dtype}")
    if not np.isfinite(x).all():
        raise ValueError(f"{path}: 'x' contains NaN or infinite values")
    return x.astype(np.float32), y.astype(np.int64)


def _as_matrix(column: np.ndarray) -> np.ndarray:
    """A Parquet list column arrives as an object array of rows; stack it into [rows, features]."""
    if column.dtype == object:
        return np.stack([np.asarray(row, dtype=np.float32) for row in column])
    return np.asarray(column, dtype=np.float32)


def to_training_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Ray Data batch -> ``{"x": float32 [rows, features], "y": int64 [rows]}``."""
    return {"x": _as_matrix(batch["x"]), "y": np.asarray(batch["y"], dtype=np.int64)}


def parquet_paths(spec: DataSpec) -> list[str]:
    """The Parquet files a spec reads (for its fingerprint)."""
    return localized(spec).files


def is_parquet(spec: DataSpec) -> bool:
    return not spec.is_mnist1d and PurePosixPath(spec.source.partition("?")[0]).suffix == ".parquet"
