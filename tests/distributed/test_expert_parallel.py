"""Expert parallelism (ep=2, gloo, two processes) computes exactly what one process computes."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from scaleforge.distributed.ep import (
    expert_groups,
    expert_prefixes,
    gather_expert_state,
    is_expert_parameter,
    shard_experts,
    sync_gradients,
)
from scaleforge.models import MoESpec, build_model, model_family

SPEC = MoESpec(
    stem_channels=[8, 8],
    d_model=16,
    num_experts=4,
    expert_hidden=8,
    top_k=2,
    capacity_factor=100.0,
    z_loss_weight=0.001,
    num_blocks=2,
)
BATCH = 24


def _data():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 40, generator=generator), torch.randint(0, 10, (BATCH,), generator=generator)


def _model():
    torch.manual_seed(0)
    return build_model(SPEC, 40, 10).eval()  # eval: BatchNorm uses running stats, identical per rank


def _step(model, x, y):
    out = model(x)
    loss = F.cross_entropy(out, y) + model.aux_loss()
    loss.backward()
    return out.detach()


def _worker(rank, world, port, folder):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    groups = expert_groups(ep=world)
    model = _model()
    layers = model_family("moe").plan.expert_layers(model)
    prefixes = expert_prefixes(model, layers)
    shard_experts(layers, groups)
    x, y = _data()
    share = BATCH // world
    out = _step(model, x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share])
    sync_gradients(model, groups, prefixes)
    grads = {name: p.grad for name, p in model.named_parameters()}
    full = gather_expert_state(model, groups, prefixes)
    torch.save({"out": out, "grads": grads, "state": full}, os.path.join(folder, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2])
def test_ep2_forward_and_backward_match_one_process(tmp_path, world):
    reference = _model()
    x, y = _data()
    expected_out = _step(reference, x, y)
    expected = {name: p.grad for name, p in reference.named_parameters()}

    mp.spawn(_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    share, per_rank = BATCH // world, SPEC.num_experts // world
    prefixes = expert_prefixes(reference, model_family("moe").plan.expert_layers(reference))
    for rank in range(world):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        torch.testing.assert_close(
            result["out"], expected_out[rank * share : (rank + 1) * share], atol=1e-4, rtol=1e-4
        )
        for name, grad in result["grads"].items():
            if is_expert_parameter(
                name, prefixes
            ):  # local expert i on this rank is global expert rank*per_rank + i
                prefix, rest = name.split(".experts.", 1)
                local, suffix = rest.split(".", 1)
                name = f"{prefix}.experts.{rank * per_rank + int(local)}.{suffix}"
            torch.testing.assert_close(grad, expected[name], atol=1e-4, rtol=1e-4, msg=name)
        # Gathering the experts back gives the single-process model's parameters exactly.
        for name, tensor in reference.state_dict().items():
            torch.testing.assert_close(result["state"][name], tensor, atol=0, rtol=0)
