"""1-D convolutional classifier: the MNIST-1D paper's strongest model family."""

import torch
from torch import nn

from scaleforge.config.models import CNN1dSpec


def conv_blocks(
    channels: list[int], kernel_size: int, pool: bool, input_dim: int, family: str, batch_norm: bool = True
):
    """Conv1d -> BatchNorm (if ``batch_norm``) -> ReLU blocks (MaxPool1d(2) after each but the first if
    ``pool``).

    Returns:
        (blocks, output channels, output length).
    """
    blocks: list[nn.Module] = []
    in_channels, length = 1, input_dim
    for i, out_channels in enumerate(channels):
        blocks.append(nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2))
        if batch_norm:
            blocks.append(nn.BatchNorm1d(out_channels))
        blocks.append(nn.ReLU())
        length = length + 2 * (kernel_size // 2) - kernel_size + 1
        if pool and i > 0:
            blocks.append(nn.MaxPool1d(2))
            length //= 2
        in_channels = out_channels
    if length < 1:
        raise ValueError(
            f"{family}: input length {input_dim} shrinks to {length} after {len(channels)} "
            "blocks; use fewer blocks, pool=false or a smaller kernel_size"
        )
    return blocks, in_channels, length


class CNN1d(nn.Module):
    """Conv blocks over a single-channel sequence, then an MLP head on the flattened maps."""

    def __init__(self, spec: CNN1dSpec, input_dim: int, num_classes: int):
        super().__init__()
        blocks, in_channels, length = conv_blocks(
            spec.channels, spec.kernel_size, spec.pool, input_dim, "cnn1d", spec.batch_norm
        )
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_channels * length, spec.hidden),
            nn.ReLU(),
            nn.Dropout(spec.dropout),
            nn.Linear(spec.hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.unsqueeze(1)))
