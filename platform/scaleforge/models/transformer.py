"""Small multi-head self-attention classifier over patches of the input sequence."""

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator
from torch import nn


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
        layer = nn.TransformerEncoderLayer(
            spec.d_model, spec.num_heads, spec.ff_dim, spec.dropout, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, spec.num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(spec.d_model)
        self.head = nn.Linear(spec.d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x.reshape(x.shape[0], -1, self.patch_size)) + self.position
        return self.head(self.norm(self.encoder(tokens)).mean(dim=1))
