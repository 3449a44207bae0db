"""Datasets: seeded MNIST-1D with a pickle-free cache, and users' .npz / Parquet files."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scaleforge import storage
from scaleforge.config import ConfigError
from scaleforge.data import DataSpec, describe, load_arrays, load_mnist1d
from scaleforge.data.preflight import check_data, check_files


def test_mnist1d_is_seeded_split_and_cached(tmp_path):
    first = load_mnist1d(200, seed=3, test_fraction=0.2, cache_dir=str(tmp_path))
    cached = list(tmp_path.glob("*.npz"))
    assert len(cached) == 1
    with np.load(cached[0], allow_pickle=False) as stored:  # the cache needs no pickle
        assert set(stored.files) == {"x", "y", "x_test", "y_test"}
    again = load_mnist1d(200, seed=3, test_fraction=0.2, cache_dir=str(tmp_path))
    assert first["x"].shape == (160, 40) and first["x_test"].shape == (40, 40)
    assert first["x"].dtype == np.float32 and first["y"].dtype == np.int64
    assert set(np.unique(first["y"])) <= set(range(10))
    np.testing.assert_array_equal(first["x"], again["x"])
    other = load_mnist1d(200, seed=4, test_fraction=0.2, cache_dir=str(tmp_path))
    assert not np.array_equal(first["x"], other["x"])


def test_mnist1d_is_cached_in_a_bucket_and_read_back_from_it(s3):
    cache_dir = s3.uri("cache/mnist1d")
    first = load_mnist1d(200, seed=3, test_fraction=0.2, cache_dir=cache_dir)
    cached = storage.join(cache_dir, "mnist1d-n200-seed3-test0.2.npz")
    assert storage.is_file(cached)
    # A second load reads the bucket's arrays instead of generating them: mark them to tell.
    marked = dict(first, x=first["x"] + 1.0)
    storage.write_atomic(cached, lambda handle: np.savez(handle, **marked))
    again = load_mnist1d(200, seed=3, test_fraction=0.2, cache_dir=cache_dir)
    np.testing.assert_array_equal(again["x"], first["x"] + 1.0)
    np.testing.assert_array_equal(again["y_test"], first["y_test"])


def test_a_cache_dir_in_a_missing_bucket_fails_before_anything_runs(s3):
    spec = DataSpec(num_samples=200, cache_dir=s3.uri("cache", bucket="no-such-bucket"))
    with pytest.raises(
        ConfigError, match=r"^data.cache_dir: s3://no-such-bucket/cache: bucket 'no-such-bucket' "
    ):
        check_data(spec)


def test_describe_matches_what_is_loaded(tmp_path):
    spec = DataSpec(num_samples=205, seed=1, cache_dir=str(tmp_path))
    info = describe(spec)
    arrays = load_arrays(spec)
    assert (info.num_train, info.num_test, info.input_dim) == (len(arrays.y), len(arrays.y_test), 40)
    assert arrays.fingerprint == load_arrays(spec).fingerprint


def test_npz_file_is_split_with_the_seed(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "mine.npz"
    np.savez(path, x=rng.normal(size=(100, 7)).astype(np.float32), y=rng.integers(0, 3, 100))
    spec = DataSpec(source=str(path), test_fraction=0.25, seed=5)
    arrays = load_arrays(spec)
    assert arrays.x.shape == (75, 7) and arrays.x_test.shape == (25, 7)
    info = describe(spec)
    assert (info.num_train, info.input_dim, info.num_classes) == (75, 7, 3)


@pytest.mark.parametrize(
    "arrays,message",
    [
        ({"x": np.zeros((4, 3))}, "missing array(s) ['y']"),
        ({"x": np.zeros(4), "y": np.zeros(4, int)}, "'x' must be 2-D"),
        ({"x": np.full((4, 3), np.nan), "y": np.zeros(4, int)}, "NaN or infinite"),
        ({"x": np.zeros((4, 3)), "y": np.zeros(5, int)}, "one label per row"),
        ({"x": np.zeros((4, 3)), "y": np.zeros(4)}, "integer class labels"),
    ],
)
def test_bad_npz_is_rejected_with_the_reason(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError) as err:
        load_arrays(DataSpec(source=str(path)))
    assert message in str(err.value) and str(path) in str(err.value)


def test_parquet_is_described_from_metadata(tmp_path):
    path = tmp_path / "mine.parquet"
    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    pq.write_table(
        pa.table({"x": pa.array(list(x), type=pa.list_(pa.float32())), "y": pa.array(np.arange(20) % 4)}),
        path,
    )
    info = describe(DataSpec(source=str(path), test_fraction=0.25))
    assert (info.num_train, info.num_test, info.input_dim, info.num_classes) == (15, 5, 3, 4)


def test_spec_rejects_unknown_formats_and_preflight_missing_files(tmp_path):
    (tmp_path / "data.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match="must be 'mnist1d' or a file ending in .npz or .parquet"):
        DataSpec(source=str(tmp_path / "data.csv"))
    gone = DataSpec(source=str(tmp_path / "gone.parquet"))  # the schema does not look for the file
    with pytest.raises(
        ConfigError, match=rf"^data.source: data file '{tmp_path}/gone.parquet' does not exist$"
    ):
        check_files(gone)
    (tmp_path / "gone.parquet").write_text("not parquet")
    with pytest.raises(ConfigError, match=rf"^data.source: cannot read {tmp_path}/gone.parquet: "):
        check_data(gone)


def test_relative_paths_are_read_from_the_working_directory(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "mine.npz", x=rng.normal(size=(20, 3)).astype(np.float32), y=rng.integers(0, 2, 20))
    monkeypatch.chdir(tmp_path)
    spec = DataSpec(source="mine.npz")
    assert spec.source == "mine.npz"  # kept as written
    assert check_data(spec).num_train == 16 and load_arrays(spec).x.shape == (16, 3)
