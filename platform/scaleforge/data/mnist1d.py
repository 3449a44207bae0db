"""MNIST-1D (Greydanus & Kobak), generated locally with the ``mnist1d`` package and cached as ``.npz``.

Never the package's downloading loader: ``make_dataset`` is seeded and needs no network, and the
package's own cache format is pickle, which we do not load.
"""

import io

import numpy as np

from scaleforge import storage

SEQUENCE_LENGTH = 40
NUM_CLASSES = 10


def split_sizes(num_samples: int, test_fraction: float) -> tuple[int, int]:
    """(train, test) sizes that ``make_dataset`` produces: it makes ``num_samples // 10`` per class."""
    total = (num_samples // NUM_CLASSES) * NUM_CLASSES
    train = int(total * (1.0 - test_fraction))
    return train, total - train


def load_mnist1d(num_samples: int, seed: int, test_fraction: float, cache_dir: str) -> dict[str, np.ndarray]:
    """Generate (or read from cache) MNIST-1D.

    Args:
        num_samples: Examples to generate (train + test).
        seed: The generator's seed.
        test_fraction: Share held out for testing.
        cache_dir: A local folder or a URI (``s3://bucket/cache``) where the arrays are cached as
            ``.npz``, so that the nodes of a cluster generate them once.

    Returns:
        ``{"x", "y", "x_test", "y_test"}``: float32 features of length 40 and int64 labels.
    """
    cache = storage.join(cache_dir, f"mnist1d-n{num_samples}-seed{seed}-test{test_fraction:g}.npz")
    if storage.is_file(cache):
        with np.load(io.BytesIO(storage.read_bytes(cache)), allow_pickle=False) as stored:
            return {key: stored[key] for key in ("x", "y", "x_test", "y_test")}
    arrays = _generate(num_samples, seed, test_fraction)
    # Atomic: concurrent jobs never read a half-written cache file.
    storage.write_atomic(cache, lambda handle: np.savez(handle, **arrays))
    return arrays


def _generate(num_samples: int, seed: int, test_fraction: float) -> dict[str, np.ndarray]:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = seed
    args.train_split = 1.0 - test_fraction
    data = make_dataset(args)
    return {
        "x": data["x"].astype(np.float32),
        "y": data["y"].astype(np.int64),
        "x_test": data["x_test"].astype(np.float32),
        "y_test": data["y_test"].astype(np.int64),
    }
