"""Bytes of parameters, gradients and optimiser state that one worker holds.

Sharded tensors (DTensor under tensor parallelism or FSDP) count only their local shard: that
is what occupies this worker's memory. Activations and communication buffers are not counted.
"""

import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

_MIB = 2**20


@dataclass(frozen=True)
class MemoryReport:
    """Model-state bytes held by one worker."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def describe(self, reference: "MemoryReport") -> str:
        """One line: each part in MiB and the total as a fraction of ``reference`` (one process)."""
        return (
            f"params {self.params / _MIB:.1f} MiB, grads {self.grads / _MIB:.1f} MiB, "
            f"optimizer {self.optimizer / _MIB:.1f} MiB = {self.total / _MIB:.1f} MiB "
            f"({self.total / reference.total:.2f}x one process)"
        )


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor`` stored on this worker (the local shard of a DTensor)."""
    # Only a process that imported torch.distributed.tensor holds DTensors: not imported here, as its
    # import costs ~0.4 s of CPU (sympy) in every Ray Train worker and controller of a plain run.
    dtensor = sys.modules.get("torch.distributed.tensor")
    local = tensor.to_local() if dtensor is not None and isinstance(tensor, dtensor.DTensor) else tensor
    return local.numel() * local.element_size()


def memory_held(module: nn.Module, optimizer: torch.optim.Optimizer) -> MemoryReport:
    """What this worker holds of ``module``'s parameters and gradients and ``optimizer``'s state."""
    params = list(module.parameters())
    return MemoryReport(
        params=sum(local_bytes(p) for p in params),
        grads=sum(local_bytes(p.grad) for p in params if p.grad is not None),
        optimizer=sum(
            local_bytes(v) for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)
        ),
    )


def single_process_memory(module: nn.Module, optimizer_name: str) -> MemoryReport:
    """What one process training the whole (unsplit) ``module`` holds after an optimiser step.

    AdamW keeps two moments per element and a float32 ``step`` per parameter tensor; SGD with
    momentum keeps one buffer per element.
    """
    params = list(module.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    optimizer_bytes = 2 * param_bytes + 4 * len(params) if optimizer_name == "adamw" else param_bytes
    return MemoryReport(params=param_bytes, grads=param_bytes, optimizer=optimizer_bytes)


def gather_memory(mine: MemoryReport, reference: MemoryReport) -> dict[str, Any]:
    """Every rank's report (a collective), the one-process reference and the largest ratio, as JSON."""
    table = [torch.zeros(3, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(table, torch.tensor([mine.params, mine.grads, mine.optimizer]))
    reports = [MemoryReport(*(int(v) for v in row)) for row in table]
    return {
        "memory_per_worker": [vars(r) for r in reports],
        "memory_single_process": vars(reference),
        "memory_max_ratio": max(r.total for r in reports) / reference.total,
    }


def describe_memory(memory: dict[str, Any]) -> str:
    """The lines the job prints: one process, then each rank with its fraction of it."""
    reference = MemoryReport(**memory["memory_single_process"])
    return "\n".join(
        [f"[memory] one process: {reference.describe(reference)}"]
        + [
            f"[memory] rank {rank}: {MemoryReport(**r).describe(reference)}"
            for rank, r in enumerate(memory["memory_per_worker"])
        ]
    )
