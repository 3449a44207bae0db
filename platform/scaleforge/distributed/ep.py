"""Expert parallelism: each rank of an expert-parallel group holds ``num_experts / ep`` experts;
tokens travel to their experts' ranks and back with ``all_to_all`` (autograd-aware, gloo or NCCL).

Non-expert parameters stay replicated (data parallel); :func:`sync_gradients` averages every
gradient over the ranks that hold a copy of it (DDP cannot mix sharded and replicated parameters).
Which layers hold experts comes from the model's :class:`~scaleforge.distributed.plan.ParallelPlan`.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn

from scaleforge.distributed.checkpoint import load_model_weights, load_optimizer_state, save_optimizer_state
from scaleforge.distributed.ddp import DataParallel
from scaleforge.distributed.strategy import Batch, LossFn, scale_gradients
from scaleforge.routing import Routing
from scaleforge.routing.capacity import sorted_assignments


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
    """A dispatcher (see ``scaleforge.models.moe``) that sends tokens to the rank owning their expert."""

    def __init__(self, groups: ExpertGroups, num_experts: int):
        self.group, self.ep = groups.expert_group, groups.ep
        self.per_rank, self.num_experts = num_experts // groups.ep, num_experts

    def __call__(self, x: torch.Tensor, routing: Routing, experts: nn.ModuleList, capacity: int):
        _, token, weight, counts = sorted_assignments(routing, self.num_experts, capacity)
        # counts[r * per_rank + e]: this rank's tokens for expert e of rank r; swap them so each
        # rank learns how many rows it receives from every source for each of its experts.
        incoming = torch.empty_like(counts)
        dist.all_to_all_single(incoming, counts, group=self.group)
        send = counts.view(self.ep, self.per_rank).sum(dim=1).tolist()
        recv_by_source = incoming.view(self.ep, self.per_rank)
        recv = recv_by_source.sum(dim=1).tolist()
        received = dist_nn.all_to_all_single(
            x.new_empty(sum(recv), x.shape[1]), x[token], recv, send, group=self.group
        )
        processed = self._run_local_experts(received, recv_by_source, experts)
        returned = dist_nn.all_to_all_single(  # in the experts' dtype (bf16 under autocast)
            processed.new_empty(len(token), x.shape[1]), processed, send, recv, group=self.group
        )
        return torch.zeros_like(x).index_add(0, token, (returned * weight[:, None]).to(x.dtype)), counts

    def _run_local_experts(
        self, received: torch.Tensor, sizes: torch.Tensor, experts: nn.ModuleList
    ) -> torch.Tensor:
        """Rows arrive grouped by source rank, then expert; run each expert on all its rows at once."""
        segments = list(received.split(sizes.reshape(-1).tolist()))  # order: (source, expert)
        outputs = [None] * len(segments)
        for e, expert in enumerate(experts):
            mine = [s * self.per_rank + e for s in range(self.ep)]
            result = expert(torch.cat([segments[i] for i in mine]))
            for i, part in zip(mine, result.split([len(segments[i]) for i in mine])):
                outputs[i] = part
        return torch.cat(outputs)


def expert_prefixes(model: nn.Module, layers: list[nn.Module]) -> list[str]:
    """State-dict prefixes (``name.experts.``) of the experts of ``layers`` inside ``model``."""
    wanted = {id(layer) for layer in layers}
    return [f"{name}.experts." for name, module in model.named_modules() if id(module) in wanted]


def is_expert_parameter(name: str, prefixes: list[str]) -> bool:
    return any(name.startswith(prefix) for prefix in prefixes)


def shard_experts(layers: list[nn.Module], groups: ExpertGroups) -> None:
    """Keep only this rank's experts in every expert layer and switch them to all_to_all dispatch."""
    for layer in layers:
        if layer.num_experts % groups.ep:
            raise ValueError(f"ep ({groups.ep}) must divide num_experts ({layer.num_experts})")
        per_rank = layer.num_experts // groups.ep
        start = groups.ep_rank * per_rank
        layer.experts = nn.ModuleList(list(layer.experts)[start : start + per_rank])
        layer.dispatcher = ExpertParallelDispatch(groups, layer.num_experts)
        layer.all_reduce = lambda t, g=groups.expert_group: dist_nn.all_reduce(t, group=g)


@torch.no_grad()
def sync_gradients(model: nn.Module, groups: ExpertGroups, prefixes: list[str]) -> None:
    """Average gradients like DDP would: replicated parameters over all ranks, expert parameters
    over the ranks holding the same experts. Each rank's loss is a mean over its own tokens,
    so every gradient is divided by the world size."""
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        if is_expert_parameter(name, prefixes):
            if groups.world > groups.ep:
                dist.all_reduce(param.grad, group=groups.replica_group)
        else:
            dist.all_reduce(param.grad)
        param.grad /= groups.world


def _split_expert_key(name: str, prefixes: list[str]) -> tuple[str, int, str]:
    prefix = next(p for p in prefixes if name.startswith(p))
    index, suffix = name[len(prefix) :].split(".", 1)
    return prefix, int(index), suffix


def gather_expert_state(
    model: nn.Module, groups: ExpertGroups, prefixes: list[str]
) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict, assembled on every rank of the expert group."""
    state, local = {}, {p: len(model.get_submodule(p[: -len(".experts.")]).experts) for p in prefixes}
    for name, tensor in model.state_dict().items():
        if not is_expert_parameter(name, prefixes):
            state[name] = tensor.detach().clone()
            continue
        prefix, index, suffix = _split_expert_key(name, prefixes)
        parts = [torch.empty_like(tensor) for _ in range(groups.ep)]
        dist.all_gather(parts, tensor.contiguous(), group=groups.expert_group)
        for rank, part in enumerate(parts):
            state[f"{prefix}{rank * local[prefix] + index}.{suffix}"] = part
    return state


def local_expert_state(
    full: dict[str, torch.Tensor], groups: ExpertGroups, per_rank: dict[str, int], prefixes: list[str]
) -> dict[str, torch.Tensor]:
    """This rank's part of a full state dict: its own experts, renumbered from 0 (``gather``'s inverse)."""
    state = {}
    for name, tensor in full.items():
        if not is_expert_parameter(name, prefixes):
            state[name] = tensor
            continue
        prefix, index, suffix = _split_expert_key(name, prefixes)
        owner, local = divmod(index, per_rank[prefix])
        if owner == groups.ep_rank:
            state[f"{prefix}{local}.{suffix}"] = tensor
    return state


class ExpertParallel(DataParallel):
    """Experts split over each group of ``ep`` ranks; everything else replicated like DDP.

    Checkpoints hold the full weights (gathered, written by rank 0) and every rank's own optimiser
    shard (``optimizer.rank<r>.*``), since optimiser state follows the experts a rank holds.
    """

    def _wrap(self, model: nn.Module) -> nn.Module:
        model.to(self.device)  # no DDP: sync_gradients averages sharded and replicated parameters apart
        layers = self.plan.expert_layers(model)
        self.groups = expert_groups(self.dims.ep)
        self.prefixes = expert_prefixes(model, layers)
        self.per_rank = {
            p: model.get_submodule(p[: -len(".experts.")]).num_experts // self.dims.ep for p in self.prefixes
        }
        shard_experts(layers, self.groups)
        return model

    def train_step(
        self, batch: Batch, loss_fn: LossFn, scale: float = 1.0, sync: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loss, logits = super().train_step(batch, loss_fn, scale, sync)
        if sync:
            sync_gradients(self.module, self.groups, self.prefixes)
        return loss, logits

    @torch.no_grad()
    def clip_gradients(self, max_norm: float) -> float:
        """Replicated gradients count once; each expert's, held by one rank of the expert group, are
        summed over that group."""
        grads = {name: p.grad for name, p in self.module.named_parameters() if p.grad is not None}
        squares = [torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)]
        for name, grad in grads.items():
            squares[is_expert_parameter(name, self.prefixes)] += grad.double().pow(2).sum()
        dist.all_reduce(squares[1], group=self.groups.expert_group)
        return scale_gradients(list(grads.values()), (squares[0] + squares[1]).sqrt(), max_norm)

    def full_state(self) -> dict[str, torch.Tensor]:
        return gather_expert_state(self.module, self.groups, self.prefixes)

    def save(self, folder: Path, optimizer: torch.optim.Optimizer) -> bool:
        super().save(folder, optimizer)  # the gathered weights (and rank 0's optimiser shard) from rank 0
        if self.data_rank:
            save_optimizer_state(folder, optimizer, self._shard)
        return True

    def load(self, folder: Path, optimizer: torch.optim.Optimizer) -> None:
        full = load_model_weights(folder)
        self.module.load_state_dict(local_expert_state(full, self.groups, self.per_rank, self.prefixes))
        load_optimizer_state(folder, optimizer, self._shard)

    @property
    def _shard(self) -> str:
        return "" if self.data_rank == 0 else f".rank{self.data_rank}"
