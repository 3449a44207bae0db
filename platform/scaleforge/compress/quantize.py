"""int8 (CPU) and fp16/bf16 (GPU) versions of a model, and how much smaller their weights are."""

import numpy as np
import torch
from torch import nn

from scaleforge.artifacts.tensors import encode_state
from scaleforge.models.surgery import prunable_layers, quantize


def quantize_model(model: nn.Module, scheme: str, calibration: np.ndarray) -> nn.Module:
    """``scheme`` version of ``model`` (which is consumed); int8_static calibrates on ``calibration``."""
    sample = torch.as_tensor(calibration, dtype=torch.float32)
    return quantize(model, scheme, lambda prepared: [prepared(chunk) for chunk in sample.split(512)])


def float_weight_bytes(model: nn.Module, scheme: str = "int8_static") -> int:
    """Bytes of the weight matrices that ``scheme`` replaces, before quantization.

    int8_dynamic replaces Linear layers only; the other schemes also replace Conv1d.
    """
    kinds = (nn.Linear,) if scheme == "int8_dynamic" else (nn.Linear, nn.Conv1d)
    return sum(
        layer.weight.numel() * layer.weight.element_size()
        for layer in prunable_layers(model).values()
        if isinstance(layer, kinds)
    )


def quantized_weight_bytes(model: nn.Module) -> int:
    """Bytes the quantized weight matrices take in the artifact: int8 values plus per-channel
    scales and zero points (int8 schemes), or the half-precision weight tensors (fp16/bf16)."""
    tensors, _ = encode_state(model.state_dict())
    total = 0
    for key, tensor in tensors.items():
        is_int8 = tensor.dtype in (torch.int8, torch.uint8)
        is_qparam = key.endswith((".__scales", ".__zero_points"))
        is_half_weight = tensor.dtype in (torch.float16, torch.bfloat16) and key.endswith("weight")
        if is_int8 or is_qparam or is_half_weight:
            total += tensor.numel() * tensor.element_size()
    return total
