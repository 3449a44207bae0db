"""Turn a :class:`DataSpec` into the Ray Datasets that Ray Train shards across workers."""

from dataclasses import dataclass

import pyarrow as pa
import ray.data
from ray.data.extensions import ArrowTensorArray

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
from scaleforge.config.data import DataSpec


@dataclass
class TrainingData:
    """``datasets`` for ``TorchTrainer(datasets=...)`` plus what the model and the artifact need."""

    datasets: dict[str, ray.data.Dataset]
    info: DatasetInfo
    fingerprint: str


def build_ray_datasets(spec: DataSpec) -> TrainingData:
    """Ray Datasets with ``train`` and ``test`` splits, columns ``x`` (float32 rows) and ``y`` (int64).

    Parquet is read lazily with ``ray.data.read_parquet`` so data larger than one machine streams
    to the workers; in-memory arrays (MNIST-1D, ``.npz``) go to the object store once.
    """
    _quiet_ray_data()
    spec = localized(spec)
    if is_parquet(spec):
        train = ray.data.read_parquet(spec.source).map_batches(to_training_batch, batch_format="numpy")
        if spec.test_path:
            test = ray.data.read_parquet(spec.test_path).map_batches(to_training_batch, batch_format="numpy")
        else:
            train, test = train.train_test_split(test_size=spec.test_fraction, shuffle=True, seed=spec.seed)
        return TrainingData({"train": train, "test": test}, describe(spec), file_fingerprint(*parquet_paths(spec)))
    arrays = load_arrays(spec)
    datasets = {
        "train": ray.data.from_arrow(_table(arrays.x, arrays.y)),
        "test": ray.data.from_arrow(_table(arrays.x_test, arrays.y_test)),
    }
    return TrainingData(datasets, arrays.info, arrays.fingerprint)


def _table(x, y) -> pa.Table:
    return pa.table({"x": ArrowTensorArray.from_numpy(x), "y": pa.array(y)})


def _quiet_ray_data() -> None:
    # Per-epoch progress comes from the training loop; Ray Data's own bars would interleave with it.
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
