"""Small multi-head self-attention classifier over patches of the input sequence."""

from typing import Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator
from torch import nn

from scaleforge.models.moe import MoELayer, MoESpec


class TransformerSpec(BaseModel):
    """Architecture of a :class:`TransformerClassifier`."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["transformer"] = "transformer"
    patch_size: PositiveInt = 4
    """Consecutive sequence values embedded together as one token."""
    d_model: PositiveInt = 64
    """Token embedding width."""
    num_heads: PositiveInt = 4
    """Attention heads per layer; must divide d_model."""
    num_layers: PositiveInt = 2
    """Encoder layers."""
    ff_dim: PositiveInt = 128
    """Hidden width of each layer's feed-forward block."""
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Dropout inside the encoder layers."""
    moe: Optional[MoESpec] = None
    """If set, every layer's feed-forward block is this Mixture of Experts, routed per token
    (its ``d_model`` is taken from this spec)."""

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "TransformerSpec":
        if self.d_model % self.num_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.num_heads ({self.num_heads})")
        return self


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
        self.embed = nn.Linear(spec.patch_size, spec.d_model)
        self.position = nn.Parameter(torch.zeros(1, num_tokens, spec.d_model))
        nn.init.trunc_normal_(self.position, std=0.02)
        if spec.moe is not None:
            moe = spec.moe.model_copy(update={"d_model": spec.d_model})
            self.encoder = nn.Sequential(*(MoEEncoderLayer(spec, moe) for _ in range(spec.num_layers)))
        else:
            layer = nn.TransformerEncoderLayer(
                spec.d_model, spec.num_heads, spec.ff_dim, spec.dropout, batch_first=True, norm_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, spec.num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(spec.d_model)
        self.head = nn.Linear(spec.d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x.reshape(x.shape[0], -1, self.patch_size)) + self.position
        return self.head(self.norm(self.encoder(tokens)).mean(dim=1))


class MoEEncoderLayer(nn.Module):
    """Pre-norm encoder layer whose feed-forward block is a token-routed Mixture of Experts."""

    def __init__(self, spec: TransformerSpec, moe: MoESpec):
        super().__init__()
        self.norm1 = nn.LayerNorm(spec.d_model)
        self.attention = nn.MultiheadAttention(spec.d_model, spec.num_heads, spec.dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(spec.d_model)
        self.moe = MoELayer(moe)
        self.dropout = nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.dropout(self.attention(h, h, h, need_weights=False)[0])
        batch, tokens, width = x.shape
        routed = self.moe(self.norm2(x).reshape(batch * tokens, width)).reshape(batch, tokens, width)
        return x + self.dropout(routed)
