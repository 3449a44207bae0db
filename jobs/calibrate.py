"""Calibrate a cascade's thresholds on validation data and write them into the Serve config.

python -m jobs.calibrate --config configs/calibrate.yaml [--set max_accuracy_loss=0.005 ...]
"""

import sys
from typing import Optional, Sequence

from scaleforge.config import CalibrateConfig, run_job


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_job(
        CalibrateConfig,
        "scaleforge.calibrate.serve_file:calibrate_serve_file",
        argv,
        prog="jobs.calibrate",
        preflight="scaleforge.calibrate.serve_file:check_runnable",
    )


if __name__ == "__main__":
    sys.exit(main())
