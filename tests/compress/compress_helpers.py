"""A small teacher trained in-process (seconds), shared by the compression tests."""

from pathlib import Path

import torch

from scaleforge.artifacts import save_artifact
from scaleforge.compress.finetune import accuracy, finetune
from scaleforge.config.compress import FinetuneSpec
from scaleforge.data import DataSpec, load_arrays
from scaleforge.models import CNN1dSpec, build_model

TINY_DATA = {"source": "mnist1d", "num_samples": 4000, "seed": 42, "test_fraction": 0.2}
TINY_TEACHER = CNN1dSpec(channels=[32, 64, 64], kernel_size=5, pool=True, hidden=128)
# The default teacher's architecture (configs/train_teacher.yaml): sizes and speed do not depend on training.
FULL_TEACHER = CNN1dSpec(channels=[64, 128, 128], kernel_size=5, pool=True, hidden=256)


def train_tiny_teacher(folder: Path, epochs: int = 12) -> Path:
    """A cnn1d trained on 3,200 MNIST-1D examples, exported as an ordinary artifact."""
    torch.manual_seed(0)
    arrays = load_arrays(DataSpec(**TINY_DATA))
    model = build_model(TINY_TEACHER, arrays.info.input_dim, arrays.info.num_classes)
    finetune(model, arrays.x, arrays.y, FinetuneSpec(epochs=epochs, lr=3e-3, batch_size=64))
    return save_artifact(folder, model, TINY_TEACHER, input_dim=arrays.info.input_dim,
                         num_classes=arrays.info.num_classes,
                         metrics={"test_accuracy": accuracy(model, arrays.x_test, arrays.y_test)},
                         dataset={"source": "mnist1d", "fingerprint": arrays.fingerprint})
