"""What a device really delivers: matmul throughput per dtype and memory bandwidth, CPU and GPU.

The chapter's CPU-against-GPU comparison with measured numbers: each figure is the best of a
few timed repeats after a warm-up, set against the device's nominal peak where it is known.
Pure torch; ``jobs.hwbench`` runs it once on every node of a cluster.
"""

import os
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

# Nominal dense peaks (TFLOP/s fp32 / bf16, memory GB/s) from the vendors' datasheets.
GPU_PEAKS = {
    "H200": {"fp32": 67.0, "bf16": 989.0, "memory_gbps": 4800.0},
    "H100": {"fp32": 67.0, "bf16": 989.0, "memory_gbps": 3350.0},
    "A100": {"fp32": 19.5, "bf16": 312.0, "memory_gbps": 2039.0},
    "L4": {"fp32": 30.3, "bf16": 121.0, "memory_gbps": 300.0},
}


@dataclass
class DeviceReport:
    """Measured figures of one device; ``None`` where the dtype is not supported there."""

    node: str
    device: str
    name: str
    threads: int
    matmul_tflops: dict[str, Optional[float]] = field(default_factory=dict)
    memory_gbps: float = 0.0
    nominal: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def best_seconds(fn: Callable[[], object], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up call."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_tflops(device: str, dtype: torch.dtype, size: int, repeats: int) -> Optional[float]:
    """Throughput of one ``size`` x ``size`` matmul in ``dtype`` (int8: ``torch._int_mm``), or None."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    try:
        if dtype == torch.int8:
            a = torch.randint(-64, 64, (size, size), dtype=torch.int8, device=device)
            b = torch.randint(-64, 64, (size, size), dtype=torch.int8, device=device)
            seconds = best_seconds(lambda: torch._int_mm(a, b), repeats, sync)
        else:
            a = torch.randn(size, size, device=device, dtype=dtype)
            b = torch.randn(size, size, device=device, dtype=dtype)
            seconds = best_seconds(lambda: torch.matmul(a, b), repeats, sync)
    except (RuntimeError, NotImplementedError):  # the dtype has no kernel on this device
        return None
    return 2 * size**3 / seconds / 1e12


def memory_gbps(device: str, megabytes: int, repeats: int) -> float:
    """Copy bandwidth: bytes read plus bytes written per second."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    source = torch.ones(megabytes << 18, device=device)  # float32: 4 bytes each
    target = torch.empty_like(source)
    seconds = best_seconds(lambda: target.copy_(source), repeats, sync)
    return 2 * source.numel() * 4 / seconds / 1e9


def measure_devices(*, cpu_size: int = 1024, gpu_size: int = 8192, repeats: int = 5) -> list[DeviceReport]:
    """This node's CPU (all its cores) and every GPU it has."""
    node = platform.node()
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    cpu = DeviceReport(node, "cpu", platform.processor() or platform.machine(), threads)
    for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("int8", torch.int8)):
        cpu.matmul_tflops[label] = matmul_tflops("cpu", dtype, cpu_size, repeats)
    cpu.memory_gbps = memory_gbps("cpu", 256, repeats)
    reports = [cpu]
    for index in range(torch.cuda.device_count()):
        with torch.cuda.device(index):
            name = torch.cuda.get_device_name(index)
            gpu = DeviceReport(node, f"cuda:{index}", name, 0,
                               nominal=next((p for key, p in GPU_PEAKS.items() if key in name), {}))
            for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16),
                                 ("int8", torch.int8)):
                gpu.matmul_tflops[label] = matmul_tflops("cuda", dtype, gpu_size, repeats)
            gpu.memory_gbps = memory_gbps("cuda", 1024, repeats)
            reports.append(gpu)
    return reports


def format_reports(reports: list[DeviceReport]) -> str:
    """A table: one row per device, measured (and nominal where known) figures."""
    dtypes = sorted({d for r in reports for d in r.matmul_tflops}, key=["fp32", "bf16", "fp16", "int8"].index)
    header = f"{'node':16s} {'device':8s} {'name':24s} " + " ".join(f"{d + ' TFLOP/s':>13s}" for d in dtypes)
    lines = [header + f" {'mem GB/s':>9s}"]
    for r in reports:
        cells = []
        for d in dtypes:
            value = r.matmul_tflops.get(d)
            peak = r.nominal.get(d)
            text = "n/a" if value is None else f"{value:.3f}" + (f" ({value / peak:.0%})" if peak else "")
            cells.append(f"{text:>13s}")
        memory = f"{r.memory_gbps:.1f}" + (f" ({r.memory_gbps / r.nominal['memory_gbps']:.0%})"
                                           if r.nominal.get("memory_gbps") else "")
        lines.append(f"{r.node[:16]:16s} {r.device:8s} {r.name[:24]:24s} " + " ".join(cells) + f" {memory:>9s}")
    return "\n".join(lines)
