"""What a device really delivers: matmul throughput per dtype and memory bandwidth, CPU and GPU.

The chapter's CPU-against-GPU comparison with measured numbers: each figure is the best of a
few timed repeats after a warm-up, set against the device's nominal peak where it is known.
:func:`measure_devices` is pure torch; :func:`measure_cluster` runs it once on every node of a
Ray cluster (``jobs.hwbench``), and placement reads the result.
"""

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from scaleforge.storage import Location, read_text, write_atomic

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
    node_id: str = ""
    """Ray's id of the node (set when measured as a Ray task): what placement selects on."""
    node_gpus: float = 0.0
    """GPUs Ray lists for the node, measured or not."""

    def to_dict(self) -> dict:
        return asdict(self)


def best_seconds(
    fn: Callable[[], object], repeats: int, sync: Callable[[], None] = lambda: None, budget_s: float = 2.0
) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up call, fewer once ``budget_s`` has passed
    (as ``timeit``'s autorange bounds its time): a dtype with no fast kernel on a CPU (bf16 here,
    2.5 s per 1024 x 1024 matmul) costs seconds, not a minute, and its figure is as telling."""
    fn()
    sync()
    best = float("inf")
    began = time.perf_counter()
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() - began > budget_s:
            break
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
            gpu = DeviceReport(
                node,
                f"cuda:{index}",
                name,
                0,
                nominal=next((p for key, p in GPU_PEAKS.items() if key in name), {}),
            )
            for label, dtype in (
                ("fp32", torch.float32),
                ("bf16", torch.bfloat16),
                ("fp16", torch.float16),
                ("int8", torch.int8),
            ):
                gpu.matmul_tflops[label] = matmul_tflops("cuda", dtype, gpu_size, repeats)
            gpu.memory_gbps = memory_gbps("cuda", 1024, repeats)
            reports.append(gpu)
    return reports


def measure_cluster(
    *, cpu_size: int = 1024, gpu_size: int = 8192, repeats: int = 5, timeout_s: float = 300.0
) -> list[DeviceReport]:
    """:func:`measure_devices` on every alive node of the connected Ray cluster: one task pinned to
    each node, holding a CPU and all of that node's GPUs while it measures.

    Raises:
        TimeoutError: a node's measurement did not finish within ``timeout_s`` (named with what it
            waits for: other work, such as a running Serve app's replicas, holds its GPUs or CPUs).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote
    def measure(node_gpus: float) -> list[dict]:
        node_id = ray.get_runtime_context().get_node_id()
        return [
            dict(r.to_dict(), node_id=node_id, node_gpus=node_gpus)
            for r in measure_devices(cpu_size=cpu_size, gpu_size=gpu_size, repeats=repeats)
        ]

    tasks = {}
    for node in (n for n in ray.nodes() if n["Alive"]):
        cpus, gpus = node["Resources"].get("CPU", 0), node["Resources"].get("GPU", 0)
        task = measure.options(
            num_cpus=min(1, cpus),
            num_gpus=gpus,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        ).remote(gpus)
        tasks[task] = f"{node['NodeID'][:12]} ({min(1, cpus):g} CPU, {gpus:g} GPU)"
    _, pending = ray.wait(list(tasks), num_returns=len(tasks), timeout=timeout_s)
    if pending:
        for task in pending:
            ray.cancel(task, force=True)
        raise TimeoutError(
            f"the hardware measurement of node(s) {', '.join(tasks[t] for t in pending)} did not finish "
            f"within {timeout_s:.0f} s: each holds a CPU and all of its node's GPUs while it measures, and "
            "other work holds them (a running Serve app's replicas?); stop that work, or measure while the "
            "cluster is idle (python -m jobs.hwbench) and place by that file (placement.hwbench)"
        )
    return [DeviceReport(**r) for node in ray.get(list(tasks)) for r in node]


def write_reports(reports: list[DeviceReport], output: Location) -> Union[Path, str]:
    """The figures as JSON (what placement reads back with :func:`read_reports`).

    Args:
        reports: The measured devices.
        output: A local path or a URI (``s3://bucket/hwbench.json?endpoint_override=...``).

    Returns:
        Where the file was written: a local ``output`` as a :class:`~pathlib.Path`, a URI as given.
        Written atomically (:func:`scaleforge.storage.write_atomic`): placement, in another process,
        reads the old figures or the new ones, never half a file.
    """
    return write_atomic(output, json.dumps([r.to_dict() for r in reports], indent=2) + "\n")


def read_reports(location: Location) -> list[DeviceReport]:
    """The figures :func:`write_reports` wrote at ``location`` (a local path or a URI)."""
    return [DeviceReport(**r) for r in json.loads(read_text(location))]


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
        memory = f"{r.memory_gbps:.1f}" + (
            f" ({r.memory_gbps / r.nominal['memory_gbps']:.0%})" if r.nominal.get("memory_gbps") else ""
        )
        lines.append(
            f"{r.node[:16]:16s} {r.device:8s} {r.name[:24]:24s} " + " ".join(cells) + f" {memory:>9s}"
        )
    return "\n".join(lines)
