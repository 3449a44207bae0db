"""Activation checkpointing (``parallel.activation_checkpointing``) on a decoder at sequence length 512:
what a training step holds at its peak, measured in a fresh process per mode, and the ``--plan``
estimate beside it; refused for a model without transformer layers. (That recomputing leaves every
step's loss unchanged, in every layout: ``tests/distributed/test_lm_parallel.py``.)"""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

from scaleforge.config import TrainJobConfig, load_config
from scaleforge.config.loader import ConfigError

SEQ, BATCH = 512, 4
MODEL = dict(context=SEQ, d_model=256, num_heads=8, num_layers=4, ff_dim=1024, dropout=0.0)

_STEP = """
import json, resource, sys, threading
import torch
sys.path[:0] = ["platform"]
from scaleforge.models import TransformerLMSpec, build_model
from scaleforge.models.recompute import set_activation_checkpointing
torch.set_num_threads(1)
torch.manual_seed(0)
model = build_model(TransformerLMSpec(**json.loads(sys.argv[1])), {seq}, 256)
set_activation_checkpointing(model, sys.argv[2])
x = torch.randint(0, 256, ({batch}, {seq}))

def anonymous():  # resident and not file-backed: tensors, not the pages of torch's libraries
    with open("/proc/self/statm") as f:
        _, resident, shared, *_ = map(int, f.read().split())
    return (resident - shared) * resource.getpagesize()

def step():
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    held = anonymous() - before
    loss.backward()
    return loss.item(), held

before = anonymous()
step()  # the same step once first: gradients allocated, kernels and their buffers initialised
model.zero_grad(set_to_none=False)
before, peak, done = anonymous(), [0], threading.Event()

def watch():  # torch releases the GIL inside its ops: this samples the step while it runs
    while not done.is_set():
        peak[0] = max(peak[0], anonymous())
        done.wait(0.0005)

watcher = threading.Thread(target=watch)
watcher.start()
loss, held = step()
done.set()
watcher.join()
print(json.dumps({{"held": held, "peak": peak[0] - before, "loss": loss}}))
""".format(seq=SEQ, batch=BATCH)


def _step(mode: str) -> dict:
    """The second of two equal steps in a fresh process, measured in anonymous resident memory: what the
    forward pass left for backward (the activations, and the logits), the step's peak above where it
    started (with what backward recomputes and its temporaries, sampled while it runs), and the loss."""
    done = subprocess.run(
        [sys.executable, "-c", _STEP, json.dumps(MODEL), mode],
        cwd=REPO,
        # Every allocation of 64 kB or more its own mapping, returned when freed: the resident peak is
        # then the peak of what the step's tensors held at once, not of what glibc kept for reuse.
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def _planned(mode: str) -> float:
    """``--plan``'s activation GiB for one worker of the same decoder and batch."""
    from scaleforge.train.plan import memory_plan

    cfg = load_config(
        TrainJobConfig,
        REPO / "configs/train_lm_tiny.yaml",
        [
            "scaling.num_workers=1",
            f"optim.batch_size={BATCH}",
            f"data.seq_len={SEQ}",
            f"parallel.activation_checkpointing={mode}",
            *(f"model.{name}={value}" for name, value in MODEL.items()),
        ],
    )
    _, rows = memory_plan(cfg, SEQ, 256)
    return rows[0].activations


def test_full_recomputation_holds_at_most_04x_the_activations_of_none_and_the_plan_foresees_each():
    measured = {mode: _step(mode) for mode in ("none", "selective", "full")}
    for mode, step in measured.items():
        print(
            f"{mode:9s} held for backward {step['held'] / 2**20:4.0f} MiB, "
            f"step's peak +{step['peak'] / 2**20:4.0f} MiB, --plan {_planned(mode) / 2**20:4.0f} MiB, "
            f"loss {step['loss']:.6f}"
        )
    assert (
        measured["full"]["loss"] == measured["selective"]["loss"] == pytest.approx(measured["none"]["loss"])
    )
    assert measured["full"]["held"] <= 0.4 * measured["none"]["held"]
    assert measured["full"]["held"] < measured["selective"]["held"] < measured["none"]["held"]
    assert measured["full"]["peak"] < measured["none"]["peak"]
    for mode, step in measured.items():
        assert _planned(mode) == pytest.approx(step["peak"], rel=0.25), mode


def test_compiling_selective_recomputation_is_refused_before_ray_starts():
    with pytest.raises(ConfigError, match=re.escape("torch.compile cannot compile selective checkpointing")):
        load_config(
            TrainJobConfig,
            REPO / "configs/train_lm_tiny.yaml",
            ["run.compile=true", "parallel.activation_checkpointing=selective"],
        )


def test_a_model_without_transformer_layers_is_refused():
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "parallel.activation_checkpointing needs transformer layers: model.name=transformer or"
        ),
    ):
        load_config(
            TrainJobConfig, REPO / "configs/train_dp.yaml", ["parallel.activation_checkpointing=full"]
        )
