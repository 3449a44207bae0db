"""The one split of a data set's held-out part: the inputs that calibrate a cascade, and the others.

Calibration fits thresholds on the first part and reports on the second; the pipeline's query stage
scores every served model on the second part only, so no accuracy it reports was seen by calibration.
"""

from dataclasses import dataclass

import numpy as np

from scaleforge.data import DataSpec, load_arrays


@dataclass
class HeldOutSplit:
    """(inputs, labels) of the held-out split's two parts; inputs as float32."""

    calibration: tuple[np.ndarray, np.ndarray]
    """Picks the thresholds."""
    judged: tuple[np.ndarray, np.ndarray]
    """Judges them, and every served model (the pipeline's query stage)."""


def split_rows(count: int, calibration_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a held-out split of ``count`` examples: (those that calibrate, those that judge)."""
    order = np.random.default_rng(seed).permutation(count)
    cut = int(round(count * calibration_fraction))
    return order[:cut], order[cut:]


def held_out_split(data: DataSpec, calibration_fraction: float, split_seed: int) -> HeldOutSplit:
    """``data``'s held-out split, shuffled with ``split_seed`` and cut at ``calibration_fraction``."""
    arrays = load_arrays(data)
    calibration, judged = (
        (arrays.x_test[rows].astype(np.float32), arrays.y_test[rows])
        for rows in split_rows(len(arrays.y_test), calibration_fraction, split_seed)
    )
    return HeldOutSplit(calibration, judged)
