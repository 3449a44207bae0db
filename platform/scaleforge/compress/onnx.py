"""ONNX export of a compressed model for edge runtimes such as onnxruntime."""

import tempfile
from pathlib import Path
from typing import Optional

import torch

from scaleforge import storage
from scaleforge.compress.measure import example_input


def export_onnx(model: torch.nn.Module, path: str, input_dim: int, vocab: Optional[int] = None) -> None:
    """``model`` as ONNX (dynamic batch) at a path or a URI; with ``vocab``, a language model taking
    windows of ``input_dim`` token ids."""
    with tempfile.TemporaryDirectory(prefix="scaleforge-onnx-") as staging:
        local = Path(staging) / "model.onnx"
        torch.onnx.export(
            model.eval(),
            (example_input(1, input_dim, vocab),),
            str(local),
            input_names=["x"],
            output_names=["logits"],
            dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
            dynamo=False,
        )
        storage.upload(local, path)
