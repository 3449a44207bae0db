"""Elastic worker groups (``scaling.num_workers: {min: M, max: N}``): a step does the same work at every
size of the group, and ``--plan`` shows the smallest size."""

import itertools

import pytest
import torch
import torch.distributed as dist
from conftest import run_plan
from gloo_ranks import run_ranks

from scaleforge.distributed import ParallelDims
from scaleforge.distributed.batches import ReplicatedBatches
from scaleforge.distributed.strategy import Batch, accumulate, cross_entropy, parallelize
from scaleforge.models import CNN1dSpec, build_model, model_family

SLICES, BATCH, STEPS = 4, 16, 4


def _steps(slices: int) -> dict:
    """STEPS optimiser steps of a global batch of ``slices`` slices on this gloo group, whatever its
    size: the loss of each step over the whole global batch, and the weights after them."""
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = build_model(
        CNN1dSpec(channels=[8, 8], hidden=16), 40, 10
    )  # with BatchNorm: DDP broadcasts buffers
    split = parallelize(model, ParallelDims.resolve(world), model_family("cnn1d").plan, torch.device("cpu"))
    # Plain SGD: a convolution's bias before BatchNorm has a zero gradient up to rounding, which Adam
    # would scale up to a full step of noise.
    optimizer = torch.optim.SGD(split.module.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(512, 40, generator=generator), torch.randint(0, 10, (512,), generator=generator)
    losses = []
    for step in itertools.islice(ReplicatedBatches(x, y, BATCH, rank, world, 0, slices).rows(0), STEPS):
        optimizer.zero_grad()
        batches = [Batch(x[rows], y[rows]) for rows in step]
        mine = torch.zeros(2, dtype=torch.float64)
        for batch, (loss, _) in zip(batches, accumulate(split, batches, cross_entropy, slices)):
            mine += torch.tensor([loss.item() * len(batch.y), len(batch.y)], dtype=torch.float64)
        optimizer.step()
        dist.all_reduce(mine)
        losses.append((mine[0] / mine[1]).item())
    return {"losses": losses, **{name: p.detach() for name, p in split.module.named_parameters()}}


def test_a_step_is_the_same_on_one_three_or_four_ranks(tmp_path):
    """A global batch of 4 slices on 4 ranks (one each), on 3 (rank 0 takes two: uneven accumulation)
    and on 1 (all four): the same losses and the same weights after every step, to float rounding."""
    full = run_ranks(tmp_path, 4, _steps, SLICES)[0]
    for world in (3, 1):
        smaller = run_ranks(tmp_path, world, _steps, SLICES)[0]
        assert smaller["losses"] == pytest.approx(full["losses"], rel=1e-5), world
        for name, weight in full.items():
            if name != "losses":
                torch.testing.assert_close(smaller[name], weight, rtol=1e-4, atol=1e-5, msg=name)


def test_plan_prints_the_memory_per_device_at_the_smallest_size_of_the_range():
    """``--plan`` of an elastic group (its refusal of a range the layout cannot take:
    ``tests/text/test_lm_job.py::test_bad_lm_input_is_one_line_before_ray_starts``)."""
    plan = run_plan("configs/train_lm_tiny.yaml", "scaling.num_workers={min: 1, max: 4}")
    assert plan.returncode == 0, plan.stderr
    print(plan.stdout)
    lines = plan.stdout.splitlines()
    assert "{min: 1, max: 4} workers" in lines[0]
    columns = next(line for line in lines if line.startswith("dp=4")).split()
    buffers, total = float(columns[5]), float(columns[7])  # DDP's buckets, which one worker has not
    assert lines[-2].startswith("elastic {min: 1, max: 4}: at 1 worker (dp=1) each device holds ")
    held = float(lines[-2].split(" holds ")[1].split()[0])
    assert held == pytest.approx(total - buffers, abs=0.011)  # replicated: the same model state at every size
    assert lines[-2].endswith("up to 4 slices of 16 rows per step so the global batch stays 64")
