"""A key/value cache for the decoder language model, and its forward pass over new tokens only.

:class:`KVCache` holds every layer's keys and values for a fixed number of *slots* (sequences) of up
to the model's context, allocated once: the memory a generator can hold is decided when it starts,
never by the requests. :func:`extend` runs the model over each row's new tokens (a prompt, one decoded
token, or a drafter's proposals to verify) at the row's own positions, attending to what the slot
already holds, and writes their keys and values into the slot. Rows of different lengths share one
pass: the shorter are padded, and a padded position never reaches a real token's attention.

The pass reuses the model's own modules (norms, projections, feed-forward, head), so it runs the
teacher, a distilled student and their int8 versions (dynamically quantized ``Linear``) alike; it
computes what :meth:`scaleforge.models.transformer_lm.TransformerLM.forward` computes for the same
tokens (``tests/generate/test_kv.py`` compares them).
"""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def context_of(model: nn.Module) -> int:
    """The longest sequence the model's position table covers."""
    return int(model.position.shape[1])


@dataclass
class KVCache:
    """Keys and values ``[layers, slots, heads, context, head_dim]`` and each slot's filled length."""

    keys: torch.Tensor
    values: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def allocate(cls, model: nn.Module, slots: int) -> "KVCache":
        """Room for ``slots`` sequences of the model's full context, zero-filled, every slot empty."""
        layers = list(model.layers.values())
        head_dim = layers[0].attention.head_dim
        width = model.norm.normalized_shape[0]
        shape = (len(layers), slots, width // head_dim, context_of(model), head_dim)
        return cls(torch.zeros(shape), torch.zeros(shape), torch.zeros(slots, dtype=torch.long))

    @property
    def slots(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


@torch.inference_mode()
def extend(model: nn.Module, cache: KVCache, slots: list[int], rows: list[list[int]]) -> list[torch.Tensor]:
    """Run ``model`` over each row's new tokens, appended to its slot; the logits of every new token.

    Args:
        model: A :class:`~scaleforge.models.transformer_lm.TransformerLM` (eval mode).
        cache: The cache the slots are in; each slot's length advances by its row's length.
        slots: One slot per row.
        rows: The tokens to append to each slot (at least one each).

    Returns:
        Per row, ``[len(row), vocab]`` logits: position ``i`` predicts the token after ``row[i]``.

    Raises:
        ValueError: a row would run past the model's context, or is empty.
    """
    starts = cache.lengths[slots]
    counts = torch.tensor([len(row) for row in rows])
    if bool((counts == 0).any()) or bool((starts + counts > context_of(model)).any()):
        raise ValueError(
            f"rows of {counts.tolist()} tokens at lengths {starts.tolist()} do not fit the context "
            f"of {context_of(model)} (or one is empty)"
        )
    width = int(counts.max())
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.as_tensor(row)
    positions = (starts[:, None] + torch.arange(width)).clamp(max=context_of(model) - 1)
    h = model.embed(tokens) + model.position[0, positions]
    where = _Where.of(slots, starts, counts, positions)
    for layer_keys, layer_values, layer in zip(cache.keys, cache.values, model.layers.values()):
        h = h + _attend(layer, layer.norm1(h), layer_keys, layer_values, where)
        h = h + layer._feed_forward(layer.norm2(h))
    h = model.norm(h)
    logits = model.head(h) if model.head is not None else F.linear(h, model.embed.weight)
    cache.lengths[slots] = starts + counts
    return [logits[i, : len(row)] for i, row in enumerate(rows)]


@dataclass(frozen=True)
class _Where:
    """Where one call's new keys and values go in a layer's cache, what its queries read, and the mask.

    One row (a single request decoding, the latency path) uses slices of its slot: no gather, and no
    mask for one token. Several rows index their slots, padded rows write only their real tokens."""

    slot: Optional[int]
    start: int
    count: int
    index: torch.Tensor
    written: tuple[torch.Tensor, torch.Tensor]
    real: Optional[torch.Tensor]
    mask: Optional[torch.Tensor]
    seen: int

    @classmethod
    def of(
        cls, slots: list[int], starts: torch.Tensor, counts: torch.Tensor, positions: torch.Tensor
    ) -> "_Where":
        seen, width = int((starts + counts).max()), int(counts.max())
        # Query i of row b sees the keys at positions 0 .. starts[b] + i of its slot.
        mask = (torch.arange(seen)[None, None, :] <= positions[:, :, None])[:, None]
        if len(slots) == 1:
            start, count = int(starts[0]), int(counts[0])
            return cls(slots[0], start, count, torch.empty(0), (), None, None if count == 1 else mask, seen)
        index = torch.as_tensor(slots)
        # The real tokens among the padded rows (None: no row is padded, every token is real).
        real = torch.arange(width)[None, :] < counts[:, None] if bool((counts < width).any()) else None
        slots_of = index[:, None].expand(-1, width)
        written = (
            (slots_of[real], positions[real])
            if real is not None
            else (slots_of.flatten(), positions.flatten())
        )
        return cls(None, 0, 0, index, written, real, mask, seen)

    def write(self, layer: torch.Tensor, new: torch.Tensor) -> None:
        """``new``, ``[rows, tokens, heads, head_dim]``, into its place in ``layer``."""
        if self.slot is not None:
            layer[self.slot, :, self.start : self.start + self.count] = new[0].transpose(0, 1)
        else:
            layer[self.written[0], :, self.written[1]] = (
                new[self.real] if self.real is not None else new.flatten(0, 1)
            )

    def read(self, layer: torch.Tensor) -> torch.Tensor:
        if self.slot is not None:
            return layer[self.slot : self.slot + 1, :, : self.seen]
        return layer[self.index, :, : self.seen]


def _attend(
    layer: nn.Module, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, where: _Where
) -> torch.Tensor:
    """One layer's attention over its cached keys and values, after writing the new ones."""
    attention = layer.attention
    batch, tokens, _ = x.shape
    q, k, v = (
        p(x).view(batch, tokens, -1, attention.head_dim)
        for p in (attention.query, attention.key, attention.value)
    )
    where.write(keys, k)
    where.write(values, v)
    attended = F.scaled_dot_product_attention(
        q.transpose(1, 2), where.read(keys), where.read(values), attn_mask=where.mask
    )
    return attention.out(attended.transpose(1, 2).reshape(batch, tokens, -1))
