"""Expert parallelism: each rank of an expert-parallel group holds ``num_experts / ep`` experts;
tokens travel to their experts' ranks and back with ``all_to_all`` (autograd-aware, gloo or NCCL).

Non-expert parameters stay replicated (data parallel); :func:`sync_gradients` averages every
gradient over the ranks that hold a copy of it.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn

from scaleforge.models.moe import MoELayer, moe_layers, sorted_assignments
from scaleforge.routing import Routing


@dataclass
class ExpertGroups:
    """This rank's process groups for ``ep``-way expert parallelism inside ``world`` ranks.

    Ranks ``[g*ep, (g+1)*ep)`` form expert group ``g``; ranks with the same position in their
    expert group hold the same experts and form a replica group.
    """

    ep: int
    ep_rank: int
    expert_group: dist.ProcessGroup
    replica_group: dist.ProcessGroup
    world: int


def expert_groups(ep: int) -> ExpertGroups:
    """Create the expert and replica groups (every rank must call this, in the same order)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % ep:
        raise ValueError(f"ep ({ep}) must divide the number of workers ({world})")
    mine = {}
    for g in range(world // ep):  # new_group is collective: create every group on every rank
        ranks = list(range(g * ep, (g + 1) * ep))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine["expert"] = group
    for position in range(ep):
        ranks = list(range(position, world, ep))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine["replica"] = group
    return ExpertGroups(ep, rank % ep, mine["expert"], mine["replica"], world)


class ExpertParallelDispatch:
    """A :data:`~scaleforge.models.moe.Dispatcher` that sends tokens to the rank owning their expert."""

    def __init__(self, groups: ExpertGroups, num_experts: int):
        self.group = groups.expert_group
        self.ep = groups.ep
        self.per_rank = num_experts // groups.ep
        self.num_experts = num_experts

    def __call__(self, x: torch.Tensor, routing: Routing, experts: nn.ModuleList, capacity: int):
        _, token, weight, counts = sorted_assignments(routing, self.num_experts, capacity)
        # counts[r * per_rank + e]: this rank's tokens for expert e of rank r; swap them so each
        # rank learns how many rows it receives from every source for each of its experts.
        incoming = torch.empty_like(counts)
        dist.all_to_all_single(incoming, counts, group=self.group)
        send = counts.view(self.ep, self.per_rank).sum(dim=1).tolist()
        recv_by_source = incoming.view(self.ep, self.per_rank)
        recv = recv_by_source.sum(dim=1).tolist()
        received = dist_nn.all_to_all_single(x.new_empty(sum(recv), x.shape[1]), x[token], recv, send, group=self.group)
        processed = self._run_local_experts(received, recv_by_source, experts)
        returned = dist_nn.all_to_all_single(x.new_empty(len(token), x.shape[1]), processed, send, recv, group=self.group)
        return torch.zeros_like(x).index_add(0, token, returned * weight[:, None]), counts

    def _run_local_experts(self, received: torch.Tensor, sizes: torch.Tensor, experts: nn.ModuleList) -> torch.Tensor:
        """Rows arrive grouped by source rank, then expert; run each expert on all its rows at once."""
        segments = list(received.split(sizes.reshape(-1).tolist()))  # order: (source, expert)
        outputs = [None] * len(segments)
        for e, expert in enumerate(experts):
            mine = [s * self.per_rank + e for s in range(self.ep)]
            result = expert(torch.cat([segments[i] for i in mine]))
            for i, part in zip(mine, result.split([len(segments[i]) for i in mine])):
                outputs[i] = part
        return torch.cat(outputs)


def shard_experts(model: nn.Module, groups: ExpertGroups) -> nn.Module:
    """Keep only this rank's experts in every MoE layer and switch them to all_to_all dispatch."""
    for layer in moe_layers(model):
        per_rank = layer.num_experts // groups.ep
        if layer.num_experts % groups.ep:
            raise ValueError(f"ep ({groups.ep}) must divide num_experts ({layer.num_experts})")
        start = groups.ep_rank * per_rank
        layer.experts = nn.ModuleList(list(layer.experts)[start:start + per_rank])
        layer.dispatcher = ExpertParallelDispatch(groups, layer.num_experts)
        layer.all_reduce = lambda t, g=groups.expert_group: dist_nn.all_reduce(t, group=g)
    return model


def is_expert_parameter(name: str) -> bool:
    return ".experts." in f".{name}"


@torch.no_grad()
def sync_gradients(model: nn.Module, groups: ExpertGroups) -> None:
    """Average gradients like DDP would: replicated parameters over all ranks, expert parameters
    over the ranks holding the same experts. Each rank's loss is a mean over its own tokens,
    so every gradient is divided by the world size."""
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        if is_expert_parameter(name):
            if groups.world > groups.ep:
                dist.all_reduce(param.grad, group=groups.replica_group)
        else:
            dist.all_reduce(param.grad)
        param.grad /= groups.world


def gather_expert_state(model: nn.Module, groups: ExpertGroups) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict, assembled on every rank of the expert group."""
    state = {}
    for name, tensor in model.state_dict().items():
        if not is_expert_parameter(name):
            state[name] = tensor.detach().clone()
            continue
        prefix, rest = name.split(".experts.", 1)
        local_index, suffix = rest.split(".", 1)
        parts = [torch.empty_like(tensor) for _ in range(groups.ep)]
        dist.all_gather(parts, tensor.contiguous(), group=groups.expert_group)
        per_rank = len(_layer(model, prefix).experts)
        for rank, part in enumerate(parts):
            state[f"{prefix}.experts.{rank * per_rank + int(local_index)}.{suffix}"] = part
    return state


def _layer(model: nn.Module, prefix: str) -> MoELayer:
    return model.get_submodule(prefix)
