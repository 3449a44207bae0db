"""The transformer's encoder layer computes what PyTorch's pre-norm ``nn.TransformerEncoderLayer``
computes, given the same weights (the model's docstring claims those numerics)."""

import torch
from torch import nn

from scaleforge.models import TransformerSpec, build_model

SPEC = TransformerSpec(d_model=32, num_heads=4, num_layers=2, ff_dim=64, dropout=0.0)


def _reference(layer) -> nn.TransformerEncoderLayer:
    """PyTorch's layer with our layer's weights copied in (q, k, v stacked as its in-projection)."""
    ours = layer.attention
    ref = nn.TransformerEncoderLayer(
        SPEC.d_model,
        SPEC.num_heads,
        SPEC.ff_dim,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=True,
    )
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(torch.cat([ours.query.weight, ours.key.weight, ours.value.weight]))
        ref.self_attn.in_proj_bias.copy_(torch.cat([ours.query.bias, ours.key.bias, ours.value.bias]))
        ref.self_attn.out_proj.load_state_dict(ours.out.state_dict())
        ref.linear1.load_state_dict(layer.ff_in.state_dict())
        ref.linear2.load_state_dict(layer.ff_out.state_dict())
        ref.norm1.load_state_dict(layer.norm1.state_dict())
        ref.norm2.load_state_dict(layer.norm2.state_dict())
    return ref.eval()


def test_each_encoder_layer_equals_pytorchs_with_copied_weights():
    torch.manual_seed(0)
    model = build_model(SPEC, 40, 10).eval()
    x = torch.randn(8, 40 // SPEC.patch_size, SPEC.d_model)
    for layer in model.layers.values():
        ref = _reference(layer)
        with torch.no_grad():
            ours, theirs = layer(x), ref(x)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        x = ours


def test_the_comparison_would_see_a_different_layer():
    """A guard on the test itself: a perturbed weight changes the output beyond the tolerance."""
    torch.manual_seed(0)
    layer = build_model(SPEC, 40, 10).eval().layers["0"]
    ref = _reference(layer)
    with torch.no_grad():
        ref.linear2.weight[0, 0] += 0.1
        x = torch.randn(8, 10, SPEC.d_model)
        assert not torch.allclose(layer(x), ref(x), atol=1e-5)
