"""A dataset held in memory, of either kind, and the one number every model is judged by on it: a
classifier's test accuracy (higher is better), a language model's validation bits per byte (lower
is better). For jobs that train or score in a process of their own rather than through Ray Data
(compression, the parameter server)."""

from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
from torch import nn

from scaleforge.config.data import DataSpec, TextDataSpec
from scaleforge.data import DatasetInfo, load_arrays
from scaleforge.quickfit import accuracy, bits_per_byte
from scaleforge.text.dataset import read_text

METRICS = {"accuracy": "test_accuracy", "bits_per_byte": "bits_per_byte"}
"""Each quality metric and the key a training run's manifest records it under."""


@dataclass(frozen=True)
class InMemoryData:
    """Training rows and held-out rows (scoring): feature rows and labels, or a language model's
    token windows and their next tokens."""

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    info: DatasetInfo
    fingerprint: str
    tokenizer: Any = None
    """Text: the tokenizer of its tokens (the artifacts trained on it record it)."""

    @property
    def tokenizer_entry(self) -> dict:
        """``{"tokenizer": ...}`` for an artifact's manifest (text), else ``{}``."""
        return {"tokenizer": self.tokenizer.to_json()} if self.tokenizer is not None else {}

    @property
    def metric(self) -> str:
        """``accuracy`` (higher is better) or, for a language model, ``bits_per_byte`` (lower is better)."""
        return "bits_per_byte" if self.info.tokens else "accuracy"

    @property
    def vocab(self) -> Optional[int]:
        """A language model's vocabulary (its inputs are token ids below it); ``None`` for features."""
        return self.info.num_classes if self.info.tokens else None

    def score(self, model: nn.Module) -> float:
        """``model``'s :attr:`metric` on the held-out rows."""
        if self.info.tokens:
            return bits_per_byte(model, self.x_test, self.y_test, self.info.bytes_per_token)
        return accuracy(model, self.x_test, self.y_test)

    def metrics(self, model: nn.Module) -> dict[str, float]:
        """The score as an artifact's manifest records it (``test_accuracy`` or ``bits_per_byte``)."""
        return {METRICS[self.metric]: self.score(model)}


def load_in_memory(spec: Union[DataSpec, TextDataSpec], tokenizer: Any = None) -> InMemoryData:
    """MNIST-1D or a ``.npz`` file, or (``kind: text``) a corpus read and cut into windows, in memory
    (``tokenizer``: a model's own, e.g. a teacher's BPE, instead of the one ``spec`` names)."""
    if spec.kind == "text":
        text = read_text(spec, tokenizer)
        return InMemoryData(*text.train, *text.validation, text.info, text.fingerprint, text.tokenizer)
    arrays = load_arrays(spec)
    return InMemoryData(arrays.x, arrays.y, arrays.x_test, arrays.y_test, arrays.info, arrays.fingerprint)
