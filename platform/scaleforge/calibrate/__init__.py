"""Offline calibration of cascades: thresholds fitted on validation data and returned, not written.

The policy itself (confidence, routing, threshold search) is pure and lives in
:mod:`scaleforge.routing.cascade`; this package loads the models and the data around it.
"""

from scaleforge.calibrate.cascade import CascadeCalibration, CascadePoint, calibrate_cascade
from scaleforge.calibrate.split import HeldOutSplit, held_out_split, split_rows

__all__ = [
    "CascadeCalibration",
    "CascadePoint",
    "HeldOutSplit",
    "calibrate_cascade",
    "held_out_split",
    "split_rows",
]
