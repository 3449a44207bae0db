"""Small multi-head self-attention classifier over patches of the input sequence.

The attention projects queries, keys and values with three separate ``nn.Linear`` layers and
reshapes by head width, not head count, so a tensor-parallel plan can split the heads across
ranks column-wise (Megatron layout) and each rank computes its own heads unchanged. Layers live
in an ``nn.ModuleDict`` and the embedding and head may be ``None``: a pipeline stage keeps only
its own layers and every parameter keeps its name. The numerics are those of PyTorch's
pre-norm ``nn.TransformerEncoderLayer`` (ReLU feed-forward, dropout on attention weights).
"""

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from scaleforge.config.models import MoESpec, TransformerSpec
from scaleforge.models.moe import MoELayer
from scaleforge.models.recompute import Recompute, run_layer


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate query/key/value projections.

    ``forward`` infers the number of heads from the projection width, so the same code runs
    all heads in one process or ``num_heads / tp`` heads on each tensor-parallel rank.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float, causal: bool = False):
        super().__init__()
        self.head_dim = d_model // num_heads
        self.dropout, self.causal = dropout, causal
        self.query, self.key, self.value = (nn.Linear(d_model, d_model) for _ in range(3))
        self.out = nn.Linear(d_model, d_model)
        # nn.MultiheadAttention's initialisation: Xavier over the stacked q/k/v matrix, zero biases.
        stacked = torch.empty(3 * d_model, d_model)
        nn.init.xavier_uniform_(stacked)
        for projection, weight in zip((self.query, self.key, self.value), stacked.chunk(3)):
            projection.weight.data.copy_(weight)
            nn.init.zeros_(projection.bias)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = (
            p(x).view(batch, tokens, -1, self.head_dim).transpose(1, 2)
            for p in (self.query, self.key, self.value)
        )
        attended = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal
        )
        return self.out(attended.transpose(1, 2).reshape(batch, tokens, -1))


class EncoderLayer(nn.Module):
    """Pre-norm encoder layer: ``x + attention(norm(x))`` then ``x + feed_forward(norm(x))``.

    The feed-forward block is an MLP (``ff_in`` -> ``activation`` -> ``ff_out``) or, with ``moe``, a
    token-routed Mixture of Experts. ``causal``: each token attends to itself and the tokens before
    it (a decoder layer). ``recompute``: its activation checkpointing
    (:func:`~scaleforge.models.recompute.set_activation_checkpointing`).
    """

    recompute: Recompute = "none"

    def __init__(
        self,
        spec: TransformerSpec,
        moe: Optional[MoESpec] = None,
        causal: bool = False,
        activation: Callable[[torch.Tensor], torch.Tensor] = F.relu,
    ):
        super().__init__()
        self.activation = activation
        self.norm1 = nn.LayerNorm(spec.d_model)
        self.attention = SelfAttention(spec.d_model, spec.num_heads, spec.dropout, causal)
        self.norm2 = nn.LayerNorm(spec.d_model)
        if moe is None:
            self.ff_in, self.ff_out = (
                nn.Linear(spec.d_model, spec.ff_dim),
                nn.Linear(spec.ff_dim, spec.d_model),
            )
        else:
            self.moe = MoELayer(moe)
        self.dropout = nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_layer(self.recompute, self._layer, x)

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.norm1(x)))
        return x + self.dropout(self._feed_forward(self.norm2(x)))

    def _feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "moe"):
            batch, tokens, width = h.shape
            return self.moe(h.reshape(batch * tokens, width)).reshape(batch, tokens, width)
        return self.ff_out(self.dropout(self.activation(self.ff_in(h))))


class TransformerClassifier(nn.Module):
    """Patch embedding + learned positions, a pre-norm encoder, mean-pooled tokens, linear head."""

    def __init__(self, spec: TransformerSpec, input_dim: int, num_classes: int):
        super().__init__()
        if input_dim % spec.patch_size:
            raise ValueError(
                f"transformer: input length {input_dim} is not divisible by patch_size {spec.patch_size}"
            )
        self.patch_size = spec.patch_size
        num_tokens = input_dim // spec.patch_size
        self.embed: Optional[nn.Linear] = nn.Linear(spec.patch_size, spec.d_model)
        self.position: Optional[nn.Parameter] = nn.Parameter(torch.zeros(1, num_tokens, spec.d_model))
        nn.init.trunc_normal_(self.position, std=0.02)
        moe = spec.moe.model_copy(update={"d_model": spec.d_model}) if spec.moe is not None else None
        self.layers = nn.ModuleDict({str(i): EncoderLayer(spec, moe) for i in range(spec.num_layers)})
        self.norm: Optional[nn.LayerNorm] = nn.LayerNorm(spec.d_model)
        self.head: Optional[nn.Linear] = nn.Linear(spec.d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, classes]`` from ``[batch, input_dim]``; a pipeline stage without the
        embedding takes and (without the head) returns hidden states ``[batch, tokens, d_model]``."""
        h = (
            self.embed(x.reshape(x.shape[0], -1, self.patch_size)) + self.position
            if self.embed is not None
            else x
        )
        for layer in self.layers.values():
            h = layer(h)
        return self.head(self.norm(h).mean(dim=1)) if self.head is not None else h
