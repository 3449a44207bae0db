"""State dicts of compressed models as plain safetensors tensors plus a JSON layout (no pickle).

Quantized modules keep int8 tensors with their scales and zero points, packed ``(weight, bias)``
tuples and ``torch.dtype`` entries in their state dicts; safetensors holds none of those. Each
int8 tensor is stored as its integer values (``int_repr``) with its scales and zero points as
separate tensors, and the layout records how to put it back together.
"""

from typing import Any

import torch

_SCALES, _ZEROS = ".__scales", ".__zero_points"


def encode_state(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split a state dict into safetensors-storable tensors and a JSON layout.

    Plain tensors keep their key and get no layout entry, so an uncompressed model encodes to
    exactly its own state dict and an empty layout.
    """
    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, Any] = {}
    for key, value in state.items():
        layout_entry = _encode(key, value, tensors)
        if layout_entry is not None:
            layout[key] = layout_entry
    return tensors, layout


def decode_state(tensors: dict[str, torch.Tensor], layout: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`encode_state`."""
    state: dict[str, Any] = {key: value for key, value in tensors.items() if not _is_part(key, layout)}
    for key, entry in layout.items():
        state[key] = _decode(key, entry, tensors)
    return state


def _encode(key: str, value: Any, tensors: dict[str, torch.Tensor]):
    """Store ``value``'s tensors under ``key`` and return its layout entry (None: a plain tensor)."""
    if isinstance(value, torch.dtype):
        return {"kind": "dtype", "dtype": str(value).removeprefix("torch.")}
    if value is None:
        return {"kind": "none"}
    if isinstance(value, tuple):
        return {
            "kind": "tuple",
            "items": [_encode(f"{key}.{i}", item, tensors) for i, item in enumerate(value)],
        }
    value = value.detach().cpu()
    if not value.is_quantized:
        tensors[key] = value.contiguous()
        return None
    tensors[key] = value.int_repr().contiguous()
    if value.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        tensors[key + _SCALES] = value.q_per_channel_scales().contiguous()
        tensors[key + _ZEROS] = value.q_per_channel_zero_points().contiguous()
        return {"kind": "qtensor", "axis": value.q_per_channel_axis()}
    return {"kind": "qtensor", "scale": value.q_scale(), "zero_point": value.q_zero_point()}


def _decode(key: str, entry: dict[str, Any] | None, tensors: dict[str, torch.Tensor]):
    if entry is None:
        return tensors[key]
    kind = entry["kind"]
    if kind == "dtype":
        return getattr(torch, entry["dtype"])
    if kind == "none":
        return None
    if kind == "tuple":
        return tuple(_decode(f"{key}.{i}", item, tensors) for i, item in enumerate(entry["items"]))
    # Rebuilt from the integer values themselves (int8 -> qint8, uint8 -> quint8), so bit-exact.
    if "axis" in entry:
        return torch._make_per_channel_quantized_tensor(
            tensors[key], tensors[key + _SCALES], tensors[key + _ZEROS], entry["axis"]
        )
    return torch._make_per_tensor_quantized_tensor(tensors[key], entry["scale"], entry["zero_point"])


def _is_part(key: str, layout: dict[str, Any]) -> bool:
    """Whether ``key`` belongs to an encoded entry (tuple member, scales) rather than being a state key."""
    return any(key == owner or key.startswith(owner + ".") for owner in layout)
