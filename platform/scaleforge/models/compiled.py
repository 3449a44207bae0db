"""``run.compile``: ``torch.compile`` (inductor) on a model about to be split.

A transformer layer compiles its own computation (``EncoderLayer._layer``), not its module call, as
torchtitan compiles per block: FSDP's and tensor parallelism's hooks stay eager around it, every layer
shares one compiled graph (same code, its parameters as inputs), activation checkpointing wraps the
compiled function, and no parameter is renamed. A model without such layers compiles its
``forward``. What dynamo or inductor cannot compile runs eagerly, after a one-line message: the job
goes on at eager speed rather than failing.
"""

from typing import Callable

import torch
from torch import nn


class EagerOnFailure:
    """``torch.compile(fn)``, and ``fn`` itself from the first call that cannot compile on.

    Args:
        fn: What to compile.
        where: Names it in the message.
    """

    def __init__(self, fn: Callable, where: str):
        self.fn, self.where = fn, where
        self.compiled: Callable | None = torch.compile(fn)

    def __call__(self, *args, **kwargs):
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except (torch._dynamo.exc.BackendCompilerFailed, torch._dynamo.exc.Unsupported) as err:
                first_line = str(err).strip().splitlines()[0]
                print(f"[compile] {self.where} runs eagerly: torch.compile failed ({first_line})", flush=True)
                self.compiled = None
        return self.fn(*args, **kwargs)


def compile_model(model: nn.Module) -> int:
    """Compile each transformer layer of ``model`` (each module with a ``_layer``), else its ``forward``.

    Returns:
        How many functions were compiled.
    """
    layers = [(name, module) for name, module in model.named_modules() if hasattr(module, "recompute")]
    for name, layer in layers:
        layer._layer = EagerOnFailure(layer._layer, f"layer {name}")
    if not layers:
        model.forward = EagerOnFailure(model.forward, type(model).__name__)
    return max(1, len(layers))
