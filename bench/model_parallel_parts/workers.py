"""The workers of bench/model_parallel.py: the model, each layout's split, and one measured run per
layout (one process per rank, gloo on 127.0.0.1), with the time each step spends idle."""

import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.pipelining.schedules as schedules
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from scaleforge.distributed import ParallelDims
from scaleforge.distributed.memory import memory_held
from scaleforge.distributed.strategy import Batch, cross_entropy, parallelize
from scaleforge.models import TransformerSpec, build_model
from scaleforge.models.plans import TRANSFORMER

SPEC = TransformerSpec(d_model=256, num_heads=8, num_layers=4, ff_dim=1024, dropout=0.0)
GLOBAL_BATCH, MICROBATCHES, WARMUP = 64, 8, 2
LAYOUTS = {
    "dp": {},
    "tp": {"tp": None},
    "pp gpipe": {"pp": None, "pp_schedule": "gpipe"},
    "pp 1f1b": {"pp": None, "pp_schedule": "1f1b"},
    "fsdp": {"fsdp": None},
}


def _layout(name: str, world: int) -> dict:
    return {key: world if value is None else value for key, value in LAYOUTS[name].items()}


def _build(name: str, world: int):
    """(step function, module, optimizer, rows per rank) for one layout on this rank."""
    torch.manual_seed(0)
    model = build_model(SPEC, 40, 10)
    if name == "dp":
        ddp = DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(x, y):
            F.cross_entropy(ddp(x), y).backward()

        return step, model, optimizer, GLOBAL_BATCH // world, None
    layout = _layout(name, world)
    dims = ParallelDims.resolve(world, dp=1, microbatches=MICROBATCHES, **layout)
    split = parallelize(model, dims, TRANSFORMER, torch.device("cpu"))
    rows = GLOBAL_BATCH // split.data_world

    def step(x, y):
        split.train_step(Batch(x, y), cross_entropy)

    return step, split.module, torch.optim.AdamW(split.module.parameters(), lr=1e-3), rows, split


def _stage_time(split, rows: int) -> float:
    """Forward+backward of one micro-batch through this rank's stage alone, seconds (best of 5)."""
    micro = rows // MICROBATCHES
    first = split.mesh.get_local_rank("pp") == 0
    shape = (micro, 40) if first else (micro, 40 // SPEC.patch_size, SPEC.d_model)
    x = torch.randn(shape, requires_grad=not first)
    times = []
    for _ in range(5):
        begin = time.perf_counter()
        out = split.module(x)
        (
            F.cross_entropy(out, torch.zeros(micro, dtype=torch.int64)) if out.dim() == 2 else out.sum()
        ).backward()
        times.append(time.perf_counter() - begin)
    return min(times)


class _Waits:
    """Seconds this process spends in torch's pipeline schedules waiting on a send or receive: every
    schedule waits through ``schedules._wait_batch_p2p``, which this wraps (a private function of
    torch's, so a rename fails loudly here rather than reading zero)."""

    def __init__(self):
        self.seconds = 0.0
        wait = schedules._wait_batch_p2p

        def timed(work):
            begin = time.perf_counter()
            wait(work)
            self.seconds += time.perf_counter() - begin

        schedules._wait_batch_p2p = timed


def _alone_stage_time(split, rows: int) -> float:
    """:func:`_stage_time` of this rank's stage, the ranks timed one after another (no other stage
    computes on the machine meanwhile), seconds."""
    mine = 0.0
    for turn in range(dist.get_world_size()):
        dist.barrier()
        if dist.get_rank() == turn:
            mine = _stage_time(split, rows)
    dist.barrier()
    return mine


def _worker(rank, world, port, name, steps, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    step, module, optimizer, rows, split = _build(name, world)
    pipeline = split is not None and split.schedule is not None
    waits = _Waits() if pipeline else None
    generator = torch.Generator().manual_seed(rank if split is None or split.dims.fsdp_enabled else 0)
    x, y = torch.randn(rows, 40, generator=generator), torch.randint(0, 10, (rows,), generator=generator)
    times = []  # (slowest rank's step seconds, this rank's waiting seconds)
    for index in range(WARMUP + steps):
        dist.barrier()
        waited = waits.seconds if waits else 0.0
        begin = time.perf_counter()
        optimizer.zero_grad()
        step(x, y)
        optimizer.step()
        elapsed = torch.tensor([time.perf_counter() - begin])
        waited = (waits.seconds if waits else 0.0) - waited
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if index >= WARMUP:
            times.append((elapsed.item(), waited))
    held = torch.tensor([memory_held(module, optimizer).total], dtype=torch.float64)
    dist.all_reduce(held, op=dist.ReduceOp.MAX)
    step_s = statistics.median(t for t, _ in times)
    fastest, waited = min(times)
    idle = torch.tensor([waited / fastest if pipeline else 0.0])
    dist.all_reduce(idle, op=dist.ReduceOp.MAX)  # the most idle stage
    efficiency = torch.tensor([MICROBATCHES * _alone_stage_time(split, rows) / step_s if pipeline else 0.0])
    dist.all_reduce(efficiency, op=dist.ReduceOp.MAX)  # the busiest stage computes the most
    if rank == 0:
        figures = {
            "step_s": step_s,
            "held": held.item(),
            "idle": idle.item(),
            "efficiency": efficiency.item(),
        }
        with open(out + ".part", "w") as f:
            json.dump(figures, f)
        os.replace(out + ".part", out)  # whole or absent: the parent reads it as soon as it appears
    dist.barrier()
    # Not destroy_process_group and the interpreter's exit: tearing gloo down has hung (rank 0 in a
    # futex) and aborted ("terminate called without an active exception") in runs here, after every
    # figure was in. Every collective is done; the process leaves without running destructors.
    os._exit(0)


def _read(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _kill(context) -> None:
    for process in context.processes:
        if process.is_alive():
            process.kill()
            process.join()


def measure(name: str, world: int, steps: int, timeout_s: float = 300, attempts: int = 2) -> dict:
    """One layout's figures from ``world`` gloo processes; a group that does not finish in time
    (seen once: a rank lost its rendezvous port to another process) is killed and retried."""
    for attempt in range(1, attempts + 1):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory() as folder:
            out = os.path.join(folder, "result.pt")
            context = mp.spawn(_worker, args=(world, port, name, steps, out), nprocs=world, join=False)
            deadline = time.perf_counter() + timeout_s
            while not context.join(timeout=5):
                if os.path.exists(out) or time.perf_counter() > deadline:
                    break
            else:
                return _read(out)
            if os.path.exists(out):
                # Rank 0 has written the figures; a group stuck tearing down gloo (seen: rank 1 gone,
                # rank 0 waiting in a futex after writing them) is not waited for.
                with contextlib.suppress(mp.ProcessExitedException, mp.ProcessRaisedException):
                    context.join(timeout=10)  # a rank's exit after the figures changes nothing
                _kill(context)
                return _read(out)
            _kill(context)
        print(
            f"  {name} on {world} workers: no result within {timeout_s:.0f} s (attempt {attempt})",
            file=sys.stderr,
            flush=True,
        )
    raise TimeoutError(f"{name} on {world} workers did not finish in {attempts} attempts")
