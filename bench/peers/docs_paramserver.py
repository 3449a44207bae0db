"""The parameter server of Ray's documentation ("Parameter Server", Ray Core examples), the peer of
bench/paramserver.py: one ``ParameterServer`` actor whose ``apply_gradients(*gradients)`` sums the
per-layer numpy gradients, steps a torch optimiser and returns the weights, and ``DataWorker`` actors
whose ``compute_gradients(weights)`` loads them, computes a gradient and returns it as per-layer numpy
arrays. Model, optimiser and seed as our side's; the helpers are the documentation's ConvNet methods,
over any torch module.

``part=(i, n)``: the same design on n servers, server i holding the i-th of n contiguous groups of the
model's parameters (about equal in size, ``parameter_groups``); each worker returns its gradient as n
objects (``num_returns=n``), one a server, and loads the n servers' weights together."""

import warnings

import numpy as np
import ray
import torch
import torch.nn.functional as F

from scaleforge.models import MODEL_SPEC, build_model
from scaleforge.paramserver.worker import batches


def get_weights(model: torch.nn.Module, as_numpy: bool = False) -> dict:
    """The documentation's ``{k: v.cpu() ...}``; ``as_numpy``: numpy arrays instead of tensors, which
    Ray's object store passes without pickling their bytes (a faster variant, part a only)."""
    return {k: v.cpu().numpy() if as_numpy else v.cpu() for k, v in model.state_dict().items()}


def set_weights(model: torch.nn.Module, weights: dict) -> None:
    with warnings.catch_warnings():  # numpy weights from the object store are read-only; they are only read
        warnings.simplefilter("ignore", UserWarning)
        model.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})


def parameter_groups(model: torch.nn.Module, parts: int) -> list[list[int]]:
    """The indices of ``model.parameters()`` split into ``parts`` contiguous groups, each ending at the
    first parameter that takes the running size to its share of the total (as our shards split the flat
    vector, but at parameter boundaries: the documentation's server holds whole tensors)."""
    sizes = [p.numel() for p in model.parameters()]
    groups, total, running = [[] for _ in range(parts)], sum(sizes), 0
    for index, size in enumerate(sizes):
        groups[min(parts - 1, running * parts // total)].append(index)
        running += size
    assert all(groups), f"{len(sizes)} parameters cannot fill {parts} servers"
    return groups


def get_gradients(model: torch.nn.Module) -> list:
    return [None if p.grad is None else p.grad.data.cpu().numpy() for p in model.parameters()]


def set_gradients(params: list, gradients: list) -> None:
    """The documentation's, over the parameters this server holds (all of the model's on one server)."""
    for g, p in zip(gradients, params):
        if g is not None:
            p.grad = torch.from_numpy(g)


def make_optimizer(params, optimizer: str, lr: float, momentum: float = 0.0):
    """The optimiser ``ParameterShard`` builds for its slice, here for the whole model."""
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


@ray.remote
class ParameterServer:
    """Ray's documentation parameter server (model, optimiser and seed as our side's)."""

    def __init__(
        self,
        model: dict,
        input_dim: int,
        num_classes: int,
        seed: int,
        optimizer: str,
        lr: float,
        momentum: float = 0.0,
        numpy_weights: bool = False,
        part: tuple[int, int] = (0, 1),
    ):
        torch.set_num_threads(1)
        self.numpy_weights = numpy_weights
        torch.manual_seed(seed)
        self.model = build_model(MODEL_SPEC.validate_python(model), input_dim, num_classes)
        index, parts = part
        owned = set(parameter_groups(self.model, parts)[index])
        self.params = [p for i, p in enumerate(self.model.parameters()) if i in owned]
        names = [name for i, (name, _) in enumerate(self.model.named_parameters()) if i in owned]
        self.names = None if parts == 1 else set(names)  # one server: the whole state_dict, as written
        self.optimizer = make_optimizer(self.params, optimizer, lr, momentum)

    def apply_gradients(self, *gradients):
        summed_gradients = [np.stack(gradient_zip).sum(axis=0) for gradient_zip in zip(*gradients)]
        self.optimizer.zero_grad()
        set_gradients(self.params, summed_gradients)
        self.optimizer.step()
        return self.get_weights()

    def get_weights(self):
        weights = get_weights(self.model, self.numpy_weights)
        return weights if self.names is None else {k: v for k, v in weights.items() if k in self.names}


@ray.remote
class DataWorker:
    """Ray's documentation worker, on its shard of the data in the order ``AsyncWorker`` draws it.

    ``precomputed``: skip the forward and backward pass and return ``.grad`` tensors set once (part a).
    """

    def __init__(
        self,
        index: int,
        model: dict,
        input_dim: int,
        num_classes: int,
        x: np.ndarray,
        y: np.ndarray,
        batch_size: int,
        seed: int,
        precomputed: bool = False,
        servers: int = 1,
    ):
        torch.set_num_threads(1)
        self.model = build_model(MODEL_SPEC.validate_python(model), input_dim, num_classes)
        self.batches = batches(x, y, batch_size, seed)
        self.precomputed = precomputed
        self.groups = parameter_groups(self.model, servers)
        if precomputed:
            set_random_grads(self.model, index)

    def ready(self) -> bool:
        return True

    def compute_gradients(self, *weights):
        """The documentation's ``compute_gradients(weights)``; on n servers, each server's weights in,
        the gradient out as n lists (call with ``.options(num_returns=n)``)."""
        set_weights(self.model, {k: v for part in weights for k, v in part.items()})
        if not self.precomputed:
            data, target = next(self.batches)
            self.model.zero_grad()
            loss = F.cross_entropy(self.model(data), target)
            loss.backward()
        gradients = get_gradients(self.model)
        if len(self.groups) == 1:
            return gradients
        return tuple([gradients[i] for i in group] for group in self.groups)


def set_random_grads(model: torch.nn.Module, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.grad = torch.from_numpy(rng.standard_normal(tuple(p.shape), dtype=np.float32))
