"""A decoder-only language model (GPT-2's shape): token and learned position embeddings, pre-norm
decoder layers with causal ``scaled_dot_product_attention``, a final LayerNorm, and an output
projection tied to the token embedding.

The layers are :class:`~scaleforge.models.transformer.EncoderLayer` with a causal mask and GELU, so
the tensor-parallel plan of the classifier (Megatron layout) applies unchanged, and an MoE
feed-forward routes each token with the existing gates. As in the classifier, the layers live in an
``nn.ModuleDict`` and the embeddings, norm and head may be ``None``: a pipeline stage
(``scaleforge.models.plans.transformer_stage``) keeps only its own parts and every parameter keeps
its name. The last stage keeps ``embed`` too when the embeddings are tied (it is the head's weight);
``position`` marks the stage that takes tokens.
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from scaleforge.config.models import TransformerLMSpec
from scaleforge.models.transformer import EncoderLayer


class TransformerLM(nn.Module):
    """``[batch, tokens]`` token ids to next-token logits ``[batch, tokens, vocab]``.

    Args:
        spec: The architecture.
        input_dim: Sequence length of the data (at most ``spec.context``).
        num_classes: Vocabulary size of the tokenizer.
    """

    def __init__(self, spec: TransformerLMSpec, input_dim: int, num_classes: int):
        super().__init__()
        if input_dim > spec.context:
            raise ValueError(
                f"transformer_lm: sequence length {input_dim} (data.seq_len) is above "
                f"model.context ({spec.context})"
            )
        self.vocab_size = num_classes
        self.embed: Optional[nn.Embedding] = nn.Embedding(num_classes, spec.d_model)
        self.position: Optional[nn.Parameter] = nn.Parameter(torch.zeros(1, spec.context, spec.d_model))
        moe = spec.moe.model_copy(update={"d_model": spec.d_model}) if spec.moe is not None else None
        self.layers = nn.ModuleDict(
            {str(i): EncoderLayer(spec, moe, causal=True, activation=F.gelu) for i in range(spec.num_layers)}
        )
        self.norm: Optional[nn.LayerNorm] = nn.LayerNorm(spec.d_model)
        self.head: Optional[nn.Linear] = (
            None if spec.tie_embeddings else nn.Linear(spec.d_model, num_classes, bias=False)
        )
        self._initialise(spec.num_layers)

    def _initialise(self, num_layers: int) -> None:
        """GPT-2's: N(0, 0.02) embeddings and head; residual output projections scaled by 1/sqrt(2 layers)."""
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.position, std=0.02)
        if self.head is not None:
            nn.init.normal_(self.head.weight, std=0.02)
        for layer in self.layers.values():
            residual = [layer.attention.out] + ([layer.ff_out] if hasattr(layer, "ff_out") else [])
            for linear in residual:
                nn.init.normal_(linear.weight, std=0.02 / math.sqrt(2 * num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from token ids; a pipeline stage without the position table takes hidden states
        ``[batch, tokens, d_model]``, and one without the norm returns them."""
        h = self.embed(x) + self.position[:, : x.shape[1]] if self.position is not None else x
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is None:
            return h
        return F.linear(self.norm(h), self.head.weight if self.head is not None else self.embed.weight)
