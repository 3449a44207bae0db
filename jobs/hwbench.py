"""Measure every node's CPU and GPUs: matmul throughput (fp32, bf16, int8 where supported), memory bandwidth.

    python -m jobs.hwbench --config configs/hwbench.yaml
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from scaleforge.config import run_job
from scaleforge.config.hwbench import HWBenchConfig
from scaleforge.hardware import DeviceReport, format_reports, measure_devices
from scaleforge.runtime import ensure_ray


@dataclass
class HWBenchResult:
    reports: list[DeviceReport]
    output: Path

    def summary(self) -> str:
        return f"{format_reports(self.reports)}\nwritten to {self.output}"


@ray.remote
def _measure(cpu_size: int, gpu_size: int, repeats: int) -> list[dict]:
    return [r.to_dict() for r in measure_devices(cpu_size=cpu_size, gpu_size=gpu_size, repeats=repeats)]


def run_hwbench(cfg: HWBenchConfig) -> HWBenchResult:
    """One task pinned to each alive node, holding all that node's GPUs while it measures."""
    ensure_ray(min_cpus=1)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    tasks = [
        _measure.options(num_cpus=min(1, n["Resources"].get("CPU", 0)), num_gpus=n["Resources"].get("GPU", 0),
                         scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
        .remote(cfg.cpu_matmul_size, cfg.gpu_matmul_size, cfg.repeats)
        for n in nodes
    ]
    reports = [DeviceReport(**r) for node in ray.get(tasks) for r in node]
    output = Path(cfg.output).expanduser()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps([r.to_dict() for r in reports], indent=2) + "\n")
    return HWBenchResult(reports, output)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_job(HWBenchConfig, run_hwbench, argv, prog="jobs.hwbench")


if __name__ == "__main__":
    sys.exit(main())
