"""Turn a :class:`DataSpec` into the Ray Datasets that Ray Train shards across workers."""

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Union

import pyarrow as pa
import ray.data
from ray.data.extensions import ArrowTensorArray

from scaleforge import storage
from scaleforge.config.data import DataSpec, TextDataSpec
from scaleforge.data.sources import (
    DatasetInfo,
    describe,
    file_fingerprint,
    is_parquet,
    load_arrays,
    localized,
    parquet_paths,
    to_training_batch,
)
from scaleforge.text.dataset import read_text, text_datasets


@dataclass
class TrainingData:
    """``datasets`` for ``TorchTrainer(datasets=...)`` plus what the model and the artifact need."""

    datasets: dict[str, ray.data.Dataset]
    info: DatasetInfo
    fingerprint: str
    tokenizer: Any = None
    """Text: the tokenizer of its tokens (the artifact records it)."""


def build_ray_datasets(spec: Union[DataSpec, TextDataSpec]) -> TrainingData:
    """Ray Datasets with ``train`` and ``test`` splits, columns ``x`` (float32 rows) and ``y`` (int64);
    for text, token windows and their next tokens (:mod:`scaleforge.text.dataset`).

    Parquet is read with ``ray.data.read_parquet``. Data larger than a tenth of the object store
    streams to the workers, read again every epoch; smaller data is read once and kept in the object
    store (``materialize``, as Ray Data advises for data that fits): re-reading costs seconds per
    epoch. In-memory arrays (MNIST-1D, ``.npz``) go to the object store once.
    """
    _quiet_ray_data()
    spec = localized(spec)
    if spec.kind == "text":
        splits = read_text(spec)
        return TrainingData(text_datasets(splits), splits.info, splits.fingerprint, splits.tokenizer)
    if is_parquet(spec):
        info = describe(spec)
        keep = _fits_in_object_store((info.num_train + info.num_test) * (info.input_dim + 1) * 4)
        train, test = (_read_parquet(path, keep) for path in (spec.source, spec.test_path))
        if test is None:
            train, test = train.train_test_split(test_size=spec.test_fraction, shuffle=True, seed=spec.seed)
        return TrainingData({"train": train, "test": test}, info, file_fingerprint(*parquet_paths(spec)))
    arrays = load_arrays(spec)
    datasets = {
        "train": ray.data.from_arrow(_table(arrays.x, arrays.y)),
        "test": ray.data.from_arrow(_table(arrays.x_test, arrays.y_test)),
    }
    return TrainingData(datasets, arrays.info, arrays.fingerprint)


def _read_parquet(path, keep: bool):
    if not path:
        return None
    filesystem, inner = storage.resolve(path)
    with _one_footer_reader():  # a DataSpec names one .parquet file
        dataset = ray.data.read_parquet(inner, filesystem=filesystem)
        dataset = dataset.map_batches(to_training_batch, batch_format="numpy")
        return dataset.materialize() if keep else dataset


@contextmanager
def _one_footer_reader():
    """Ray Data 2.60 lists Parquet files by reading their footers on a pool of 32 actors (its default,
    ``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS``), a process each: reading one small file took 6.9 s against
    3.6 s with one actor. One actor, where this process lists the file (a dataset it materializes; a
    lazy one is listed where it executes); a value the user set stays."""
    name = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"
    if name in os.environ:
        yield
        return
    os.environ[name] = "1"
    try:
        yield
    finally:
        del os.environ[name]


def _fits_in_object_store(nbytes: int) -> bool:
    return nbytes <= 0.1 * ray.cluster_resources().get("object_store_memory", 0)


def _table(x, y) -> pa.Table:
    return pa.table({"x": ArrowTensorArray.from_numpy(x), "y": pa.array(y)})


def _quiet_ray_data() -> None:
    # Per-epoch progress comes from the training loop; Ray Data's own bars would interleave with it.
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
