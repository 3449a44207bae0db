"""Run a function on N local processes joined in one gloo process group, as the strategies' unit tests do."""

import multiprocessing
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank, world, port, folder, work, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        torch.save(work(*args), os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


# Ranks fork from one server process that imported these once (multiprocessing's forkserver), rather
# than each starting a fresh interpreter that imports torch again (seconds of CPU per rank here).
multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "scaleforge.distributed.strategy"])


def run_ranks(folder: Path, world: int, work, *args) -> list:
    """``work(*args)`` on ``world`` ranks (a module-level function, so the processes can import it);
    each rank's return value (tensors, numbers, dicts: what ``torch.save`` writes), in rank order."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        _rank, args=(world, port, str(folder), work, args), nprocs=world, join=True, start_method="forkserver"
    )
    return [torch.load(Path(folder) / f"rank{r}.pt", weights_only=True) for r in range(world)]
