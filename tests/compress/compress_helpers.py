"""Small teachers trained in-process (seconds), shared by the compression tests: a classifier and a
language model."""

from pathlib import Path

import pytest
import torch

from scaleforge.artifacts import save_artifact
from scaleforge.compress.finetune import accuracy, finetune
from scaleforge.compress.steps import FinetuneSpec
from scaleforge.config.data import TextDataSpec
from scaleforge.config.models import TransformerLMSpec
from scaleforge.data import DataSpec, load_arrays
from scaleforge.data.in_memory import load_in_memory
from scaleforge.models import CNN1dSpec, build_model
from scaleforge.quickfit import fit
from scaleforge.text.tokenizer import ByteTokenizer


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Same thread count as the job's measurements (extra OpenMP threads spin on a loaded machine); a
    module that imports this fixture runs all its tests with it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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
    return save_artifact(
        folder,
        model,
        TINY_TEACHER,
        input_dim=arrays.info.input_dim,
        num_classes=arrays.info.num_classes,
        metrics={"test_accuracy": accuracy(model, arrays.x_test, arrays.y_test)},
        dataset={"source": "mnist1d", "fingerprint": arrays.fingerprint},
    )


# A language-model teacher: the first 120 kB of the standard-library corpus in windows of 64 bytes.
TINY_TEXT = {
    "kind": "text",
    "source": "stdlib",
    "seq_len": 64,
    "max_train_bytes": 120_000,
    "max_validation_bytes": 30_000,
}
TINY_LM = TransformerLMSpec(context=64, d_model=64, num_heads=4, num_layers=2, ff_dim=256, dropout=0.0)


def train_tiny_lm_teacher(folder: Path, epochs: int = 2) -> Path:
    """A transformer_lm fitted in this process (seconds) on TINY_TEXT, exported as a training run
    exports one."""
    torch.manual_seed(0)
    data = load_in_memory(TextDataSpec(**TINY_TEXT))
    model = build_model(TINY_LM, data.info.input_dim, data.info.num_classes)
    fit(model, data.x, data.y, epochs=epochs, batch_size=32, lr=3e-3)
    return save_artifact(
        folder,
        model,
        TINY_LM,
        input_dim=data.info.input_dim,
        num_classes=data.info.num_classes,
        metrics=data.metrics(model),
        dataset={"source": "stdlib", "fingerprint": data.fingerprint},
        extra={"tokenizer": ByteTokenizer().to_json()},
    )
