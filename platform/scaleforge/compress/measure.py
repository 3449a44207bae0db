"""What every compressed model is judged by: weights, bytes on disk, CPU latency, accuracy."""

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn


@dataclass
class StepRecord:
    """One model in the report: the teacher, a recipe step's output or a sweep point."""

    name: str
    step: str
    artifact: str
    parameters: int
    bytes: int
    accuracy: float
    latency_ms: dict[int, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["latency_ms"] = {str(batch): ms for batch, ms in self.latency_ms.items()}
        return record


def folder_bytes(path: str | Path) -> int:
    """Bytes on disk of an artifact folder (weights + manifest)."""
    return sum(item.stat().st_size for item in Path(path).iterdir() if item.is_file())


@torch.inference_mode()
def latency_ms(model: nn.Module, input_dim: int, batch_sizes: list[int], repeats: int, threads: int) -> dict[int, float]:
    """Median forward time per batch size, with ``threads`` intra-op threads for every model alike."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model.eval()
        result = {}
        for batch in batch_sizes:
            x = torch.randn(batch, input_dim)
            for _ in range(3):  # warm-up: allocator, packed-weight caches
                model(x)
            times = []
            for _ in range(repeats):
                began = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - began)
            result[batch] = statistics.median(times) * 1e3
        return result
    finally:
        torch.set_num_threads(previous)
