"""Two small byte-level language models trained in seconds on the standard library's source, saved as
artifacts with their tokenizer: a target and a smaller drafter, for the generator tests. Trained once per
suite run (:func:`trained_lms`), into the folder pytest-xdist's workers share, under a file lock."""

import json
import os

import numpy as np
import pytest
import torch
from filelock import FileLock

from scaleforge.artifacts import save_artifact
from scaleforge.config.models import TransformerLMSpec
from scaleforge.models import build_model
from scaleforge.quickfit import fit
from scaleforge.text.corpus import load_corpus
from scaleforge.text.dataset import windows
from scaleforge.text.tokenizer import ByteTokenizer

CONTEXT = 64
TARGET = TransformerLMSpec(context=CONTEXT, d_model=64, num_heads=4, num_layers=2, ff_dim=128, dropout=0.0)
DRAFTER = TransformerLMSpec(context=CONTEXT, d_model=32, num_heads=2, num_layers=1, ff_dim=64, dropout=0.0)


def stdlib_bytes() -> tuple[bytes, bytes]:
    """The first 400 kB of the training split and 20 kB of the validation split."""
    corpus = load_corpus("stdlib")
    return corpus.read("train")[:400_000], corpus.read("validation")[:20_000]


def train_lm(folder, spec: TransformerLMSpec, seed: int) -> str:
    torch.manual_seed(seed)
    x, y = windows(np.frombuffer(stdlib_bytes()[0], np.uint8).astype(np.int64), CONTEXT)
    model = fit(build_model(spec, CONTEXT, 256), x, y, epochs=1, batch_size=32, lr=3e-3)
    extra = {"tokenizer": ByteTokenizer().to_json()}
    return str(save_artifact(folder, model, spec, input_dim=CONTEXT, num_classes=256, extra=extra))


def trained_lms(factory: pytest.TempPathFactory) -> dict[str, str]:
    """Artifact folders ``target`` and ``drafter``; the first worker to ask trains them, the others wait
    on the lock and read the index it wrote."""
    base = factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "generator-lms"
    index = root / "lms.json"
    with FileLock(f"{root}.lock"):
        if not index.is_file():
            root.mkdir(parents=True, exist_ok=True)
            paths = {
                "target": train_lm(root / "target", TARGET, 0),
                "drafter": train_lm(root / "drafter", DRAFTER, 1),
            }
            index.write_text(json.dumps(paths))
    return json.loads(index.read_text())
