"""Multi-layer perceptron over the flat input vector."""

import torch
from torch import nn

from scaleforge.config.models import MLPSpec


class MLP(nn.Module):
    """Linear -> ReLU (-> Dropout) blocks followed by a linear classifier."""

    def __init__(self, spec: MLPSpec, input_dim: int, num_classes: int):
        super().__init__()
        layers: list[nn.Module] = []
        width = input_dim
        for size in spec.hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            if spec.dropout:
                layers.append(nn.Dropout(spec.dropout))
            width = size
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
