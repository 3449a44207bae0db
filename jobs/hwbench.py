"""Measure every node's CPU and GPUs: matmul throughput (fp32, bf16, int8 where supported), memory bandwidth.

python -m jobs.hwbench --config configs/hwbench.yaml
"""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

from scaleforge.config import run_job
from scaleforge.config.hwbench import HWBenchConfig
from scaleforge.deployment.hardware import DeviceReport, format_reports, measure_cluster, write_reports
from scaleforge.runtime import ensure_ray
from scaleforge.storage import check_fields, describe


@dataclass
class HWBenchResult:
    reports: list[DeviceReport]
    output: Union[Path, str]
    """Where the figures were written: a local path, or the URI as the config gave it."""

    def summary(self) -> str:
        return f"{format_reports(self.reports)}\nwritten to {describe(self.output)}"


def run_hwbench(cfg: HWBenchConfig) -> HWBenchResult:
    """Measure every alive node (one pinned task each) and write the figures as JSON."""
    ensure_ray(min_cpus=1)
    reports = measure_cluster(cpu_size=cfg.cpu_matmul_size, gpu_size=cfg.gpu_matmul_size, repeats=cfg.repeats)
    return HWBenchResult(reports, write_reports(reports, cfg.output))


def check_runnable(cfg: HWBenchConfig) -> None:
    """Before Ray starts: ``output``'s storage is reachable (a URI's endpoint and bucket).

    Raises:
        scaleforge.storage.StorageError: ``output: s3://...: bucket 'x' does not exist`` and the like.
    """
    check_fields({"output": cfg.output})


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_job(HWBenchConfig, run_hwbench, argv, prog="jobs.hwbench", preflight=check_runnable)


if __name__ == "__main__":
    sys.exit(main())
