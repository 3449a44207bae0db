"""A shard's update rule: torch's own SGD and Adam, called through their functional forms.

``torch.optim.sgd.sgd`` and ``torch.optim.adam.adam`` are what ``torch.optim.SGD.step`` and
``torch.optim.Adam.step`` run on a CPU tensor, here on the same state under the same names
(``momentum_buffer``; ``step``, ``exp_avg``, ``exp_avg_sq``) with the classes' defaults, so a shard
takes the classes' steps exactly (``tests/paramserver/test_update.py``) and its checkpoints keep
their layout. The classes are not built because an ``Optimizer``'s first ``add_param_group`` imports
``torch._dynamo``: about a CPU-second in every shard's process, and again in every restarted one, for
one flat tensor that never meets a compiler.
"""

import torch
from torch.optim.adam import adam
from torch.optim.sgd import sgd

ADAM = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
"""``torch.optim.Adam``'s defaults."""


class SliceOptimizer:
    """``kind`` (``sgd`` with ``momentum``, or ``adam``) applied to ``param`` in place; ``state`` is
    what ``torch.optim``'s class would hold in ``optimizer.state[param]``."""

    def __init__(self, param: torch.Tensor, kind: str, momentum: float = 0.0):
        if kind not in ("sgd", "adam"):
            raise ValueError(f"optimizer {kind!r}: expected 'sgd' or 'adam'")
        self.param, self.kind, self.momentum = param, kind, momentum
        self.state: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def step(self, grad: torch.Tensor, lr: float) -> None:
        """One step of size ``lr`` along ``grad``."""
        if self.kind == "adam":
            if not self.state:  # as Adam's first step creates it
                zeros = torch.zeros_like(self.param, memory_format=torch.preserve_format)
                self.state = {"step": torch.tensor(0.0), "exp_avg": zeros, "exp_avg_sq": zeros.clone()}
            state = self.state
            adam(
                [self.param],
                [grad],
                [state["exp_avg"]],
                [state["exp_avg_sq"]],
                [],
                [state["step"]],
                foreach=False,
                amsgrad=False,
                lr=lr,
                weight_decay=0.0,
                maximize=False,
                **ADAM,
            )
            return
        buffers = [self.state.get("momentum_buffer")]
        sgd(
            [self.param],
            [grad],
            buffers,
            foreach=False,
            weight_decay=0.0,
            momentum=self.momentum,
            lr=lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
        )
        if self.momentum:  # SGD keeps a buffer only with momentum
            self.state["momentum_buffer"] = buffers[0]
