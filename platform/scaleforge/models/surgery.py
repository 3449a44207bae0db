"""Architecture edits made by compression, replayed by the artifact loader.

A compressed model is its registry spec plus an ordered list of edits (JSON): ``shapes``
(structured pruning rebuilt some layers narrower), ``factorize`` (a Linear became two thin
ones) and ``quantize`` (int8 or half-precision modules). Compression builds its models with
these same functions, and each step's ``replay`` (``scaleforge.compress.steps``) calls them
again on load, so the loader reproduces the exact module tree and the saved state loads into it
without pickle.
"""

import warnings
from typing import Any, Callable

import torch
from torch import nn

# Eager-mode fusion patterns (torch.ao.quantization.fuse_modules) found inside nn.Sequential.
_FUSIONS = (
    (nn.Conv1d, nn.BatchNorm1d, nn.ReLU),
    (nn.Conv1d, nn.BatchNorm1d),
    (nn.Conv1d, nn.ReLU),
    (nn.Linear, nn.ReLU),
)
QUANT_SCHEMES = ("int8_static", "int8_dynamic", "fp16", "bf16")

Edit = dict[str, Any]


def prunable_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The Linear and Conv1d layers by qualified name (what pruning and factorization act on)."""
    return {
        name: module for name, module in model.named_modules() if isinstance(module, (nn.Linear, nn.Conv1d))
    }


def default_layers(model: nn.Module, kinds: tuple) -> list[str]:
    """Every layer of ``kinds`` except the output layer (pruning the logits would drop classes)."""
    names = [name for name, layer in prunable_layers(model).items() if isinstance(layer, kinds)]
    output = list(prunable_layers(model))[-1]
    return [name for name in names if name != output]


def layer_shapes(model: nn.Module) -> dict[str, list[int]]:
    """``[in, out]`` of every Conv1d/Linear and ``[features]`` of every BatchNorm1d."""
    shapes = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.BatchNorm1d):
            shapes[name] = [module.num_features]
        elif isinstance(module, nn.Conv1d):
            shapes[name] = [module.in_channels, module.out_channels]
        elif isinstance(module, nn.Linear):
            shapes[name] = [module.in_features, module.out_features]
    return shapes


def apply_shapes(model: nn.Module, shapes: dict[str, list[int]]) -> nn.Module:
    """Rebuild (freshly initialised) every layer whose shape differs from ``shapes``."""
    current = layer_shapes(model)
    for name, shape in shapes.items():
        if name not in current:
            raise ValueError(f"shapes edit names layer {name!r}, which the model does not have")
        if current[name] != list(shape):
            _set_submodule(model, name, _resized(model.get_submodule(name), shape))
    return model


def factorize(model: nn.Module, name: str, rank: int) -> nn.Sequential:
    """Replace Linear ``name`` (W: out x in) by ``Linear(in, rank, bias=False) -> Linear(rank, out)``.

    Returns:
        The new two-layer module (weights to be filled by the caller or a state dict).
    """
    layer = model.get_submodule(name)
    if not isinstance(layer, nn.Linear):
        raise ValueError(
            f"layer {name!r} is a {type(layer).__name__}; low-rank factorization takes Linear layers"
        )
    if not 1 <= rank <= min(layer.in_features, layer.out_features):
        raise ValueError(
            f"rank {rank} for layer {name!r} must be between 1 and "
            f"{min(layer.in_features, layer.out_features)} (its shape is "
            f"{layer.out_features} x {layer.in_features})"
        )
    pair = nn.Sequential(
        nn.Linear(layer.in_features, rank, bias=False),
        nn.Linear(rank, layer.out_features, bias=layer.bias is not None),
    )
    _set_submodule(model, name, pair)
    return pair


def quantize(model: nn.Module, scheme: str, calibrate: Callable[[nn.Module], None]) -> nn.Module:
    """The ``scheme`` version of ``model`` (eval mode; ``model`` itself may be modified).

    ``int8_static`` fuses Conv-BN-ReLU / Linear-ReLU, observes activations while ``calibrate``
    runs the prepared model, and converts Conv1d and Linear to int8 kernels (per-channel
    weights, fbgemm/x86): the path that speeds up convolutions. ``int8_dynamic`` converts only
    Linear layers (activations quantized on the fly). ``fp16``/``bf16`` cast the weights and
    the input, returning float32 logits.
    """
    import torch.ao.quantization as tq  # deprecated namespace in torch 2.13, still the CPU int8 path

    model = model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if scheme == "int8_dynamic":
            return tq.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        if scheme in ("fp16", "bf16"):
            return HalfPrecision(model, torch.float16 if scheme == "fp16" else torch.bfloat16)
        if scheme != "int8_static":
            raise ValueError(
                f"unknown quantization scheme {scheme!r}; choose one of {', '.join(QUANT_SCHEMES)}"
            )
        wrapped = tq.QuantWrapper(model)
        for group in _fusable_groups(wrapped):
            tq.fuse_modules(wrapped, group, inplace=True)
        wrapped.qconfig = tq.get_default_qconfig("x86")
        tq.prepare(wrapped, inplace=True)
        with torch.inference_mode():
            calibrate(wrapped)
        return tq.convert(wrapped, inplace=True)


class HalfPrecision(nn.Module):
    """A model cast to fp16/bf16 that takes and returns float32 (for GPU serving); a language model's
    token ids go in as they are."""

    def __init__(self, module: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.module = module.to(dtype)
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x.to(self.dtype) if x.is_floating_point() else x).float()


def count_weights(model: nn.Module) -> int:
    """Parameters of ``model`` plus its int8 weights (``parameters()`` misses packed int8 tensors)."""
    total = sum(parameter.numel() for parameter in model.parameters())
    for value in model.state_dict().values():
        if isinstance(value, tuple):  # packed (int8 weight, float bias) of a quantized Linear
            total += sum(item.numel() for item in value if isinstance(item, torch.Tensor))
        elif isinstance(value, torch.Tensor) and value.is_quantized:
            total += value.numel()
    return total


def _fusable_groups(root: nn.Module) -> list[list[str]]:
    groups = []
    for name, module in root.named_modules():
        if not isinstance(module, nn.Sequential):
            continue
        children = list(module.named_children())
        index = 0
        while index < len(children):
            match = _match_fusion([child for _, child in children[index:]])
            if match:
                groups.append([f"{name}.{child}" for child, _ in children[index : index + match]])
            index += max(match, 1)
    return groups


def _match_fusion(modules: list[nn.Module]) -> int:
    for pattern in _FUSIONS:
        if len(modules) >= len(pattern) and all(type(m) is t for m, t in zip(modules, pattern)):
            return len(pattern)
    return 0


def _resized(layer: nn.Module, shape: list[int]) -> nn.Module:
    if isinstance(layer, nn.BatchNorm1d):
        return nn.BatchNorm1d(shape[0], eps=layer.eps, momentum=layer.momentum, affine=layer.affine)
    if isinstance(layer, nn.Conv1d):
        if layer.groups != 1:
            raise ValueError("grouped convolutions cannot be resized")
        return nn.Conv1d(
            shape[0],
            shape[1],
            layer.kernel_size,
            stride=layer.stride,
            padding=layer.padding,
            dilation=layer.dilation,
            bias=layer.bias is not None,
        )
    if isinstance(layer, nn.Linear):
        return nn.Linear(shape[0], shape[1], bias=layer.bias is not None)
    raise ValueError(f"cannot resize a {type(layer).__name__}")


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)
