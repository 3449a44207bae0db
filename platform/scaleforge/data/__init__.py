"""Datasets: MNIST-1D generated locally, or a user's ``.npz``/Parquet, fed to workers via Ray Data."""

from scaleforge.config.data import DataSpec
from scaleforge.data.mnist1d import load_mnist1d
from scaleforge.data.sources import ArraySplits, DatasetInfo, describe, load_arrays, localized

__all__ = ["DataSpec", "DatasetInfo", "ArraySplits", "describe", "load_arrays", "load_mnist1d", "localized"]
