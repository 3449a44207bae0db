"""Why ``torch.compile`` does not speed up the tiny language model's data-parallel step on these
cores: what a compiled call costs besides its kernels, against how much work each call does.

    .venv/bin/python bench/lm_compile.py      (about 5 minutes on 2 idle cores)

``bench/lm_levers.py`` finds ``run.compile`` at 0.91x eager on dp=2 of ``configs/train_lm_tiny.yaml``
(issue 48 asks for 1.15x, or a measured explanation). Each rank of that job runs one process, one
thread, its own batch; DDP's all-reduce is outside the compiled layers (``scaleforge.models.compiled``
compiles each decoder layer's computation, as torchtitan does). So one process with one thread,
training one rank's batch, measures what compiling changes in a rank's step:

1. **Steps**, eager and compiled (each layer, ``compile_model`` as the job calls it), AdamW included, at
   the tiny config's shape and at larger ones (width, tokens per batch): milliseconds per step, medians
   of 3 rounds alternating eager and compiled (30 steps each, after 10 warm-up steps that compile).
2. **What fusion could give at most**, per shape: the share of an eager step that goes to matrix
   multiplications, attention (kernels inductor leaves to oneDNN / MKL, from torch's profiler) and the
   optimiser (outside the compiled layers); fusing everything else to nothing would speed the step up
   by ``1 / share``, the ceiling. ``bench/lm_levers.py`` prints the tiny shape's.
3. **A compiled call's own cost**: one decoder layer's forward and backward on a single token (kernels
   next to nothing), compiled minus eager, times the calls a tiny step makes, over its eager step: a
   fixed cost per call that small kernels cannot pay back would show here.

The bar: compiled at least 1.15x eager at the tiny shape (the issue's), with the ceiling and the
share of it reached beside every shape.
"""

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from bars import print_bars  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge.config import TrainJobConfig, load_config  # noqa: E402
from scaleforge.models import build_model  # noqa: E402
from scaleforge.models.compiled import compile_model  # noqa: E402

CONFIG = ROOT / "configs" / "train_lm_tiny.yaml"
SHAPES = {  # name: overrides of the tiny config (one rank's batch)
    "tiny (d 64, 2 layers, 16 x 64 tokens)": (),
    "d 128, 4 layers, 8 x 128 (train_lm_small)": (
        "model.d_model=128",
        "model.num_layers=4",
        "model.ff_dim=512",
        "data.seq_len=128",
        "model.context=128",
        "optim.batch_size=8",
    ),
    "d 256, 4 layers, 16 x 128": (
        "model.d_model=256",
        "model.num_layers=4",
        "model.ff_dim=1024",
        "data.seq_len=128",
        "model.context=128",
        "optim.batch_size=16",
    ),
}
ROUNDS, STEPS, WARMUP = 3, 30, 10
BAR = 1.15


def _model(overrides: tuple[str, ...], compiled: bool):
    cfg = load_config(TrainJobConfig, CONFIG, list(overrides))
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.data.seq_len, 256)
    if compiled:
        compile_model(model)
    batch = torch.randint(0, 256, (cfg.optim.batch_size, cfg.data.seq_len))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch


def _step(model, optimizer, batch) -> None:
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(batch).flatten(0, 1), batch.flatten()).backward()
    optimizer.step()


def _ms_per_step(setup, steps: int) -> float:
    model, optimizer, batch = setup
    started = time.perf_counter()
    for _ in range(steps):
        _step(model, optimizer, batch)
    return (time.perf_counter() - started) / steps * 1e3


def steps(overrides: tuple[str, ...]) -> dict[str, list[float]]:
    """Milliseconds per step, eager and compiled, one figure per round (the order swapped each round)."""
    setups = {kind: _model(overrides, kind == "compiled") for kind in ("eager", "compiled")}
    for setup in setups.values():
        _ms_per_step(setup, WARMUP)
    timed = {kind: [] for kind in setups}
    for index in range(ROUNDS):
        for kind in ("eager", "compiled") if index % 2 == 0 else ("compiled", "eager"):
            timed[kind].append(_ms_per_step(setups[kind], STEPS))
    return timed


KERNELS = ("mm", "bmm", "linear", "matmul", "scaled_dot_product", "flash_attention")
"""Profiler op names (substrings) of the kernels that compiling does not make faster on CPU: matmuls
and attention, which inductor leaves to oneDNN / MKL."""


def kernel_share(cfg: TrainJobConfig) -> float:
    """The share of one eager training step of ``cfg``'s model (one rank's batch, one thread) that
    compiling the layers cannot shorten: the matmul and attention kernels of forward and backward
    (their share of the ops' self CPU time, from torch's profiler) and the optimiser's step (outside
    the compiled layers), each timed."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.data.seq_len, 256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    x = torch.randint(0, 256, (cfg.optim.batch_size, cfg.data.seq_len))

    def forward_backward():
        optimizer.zero_grad()
        F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()

    for _ in range(5):
        forward_backward()
        optimizer.step()
    timed = {"fb": 0.0, "opt": 0.0}
    for _ in range(20):
        started = time.perf_counter()
        forward_backward()
        timed["fb"] += time.perf_counter() - started
        started = time.perf_counter()
        optimizer.step()
        timed["opt"] += time.perf_counter() - started
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(10):
            forward_backward()
    ops = [e for e in profile.key_averages() if e.key.startswith("aten::")]
    kernels = sum(e.self_cpu_time_total for e in ops if any(k in e.key for k in KERNELS))
    in_kernels = kernels / sum(e.self_cpu_time_total for e in ops)
    return (in_kernels * timed["fb"] + timed["opt"]) / (timed["fb"] + timed["opt"])


def call_cost_us() -> float:
    """A compiled decoder layer's forward and backward on one token, minus the eager layer's, in
    microseconds: what a compiled call costs besides its kernels (guards, the autograd wrapper, the
    generated code's calls)."""
    cfg = load_config(TrainJobConfig, CONFIG)
    per_call = {}
    for kind in ("eager", "compiled"):
        torch.manual_seed(0)
        model = build_model(cfg.model, 1, 256)
        if kind == "compiled":
            compile_model(model)
        layer = next(m for m in model.modules() if hasattr(m, "recompute"))
        x = torch.randn(1, 1, cfg.model.d_model, requires_grad=True)
        for _ in range(WARMUP):
            layer(x).sum().backward()
        rounds = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            for _ in range(200):
                layer(x).sum().backward()
            rounds.append((time.perf_counter() - started) / 200 * 1e6)
        per_call[kind] = statistics.median(rounds)
    return per_call["compiled"] - per_call["eager"]


def main() -> int:
    check_and_print()
    torch.set_num_threads(1)
    print(
        f"one process, one thread, one rank's batch; ms per step (forward, backward, AdamW), medians of "
        f"{ROUNDS} rounds of {STEPS} steps, eager and compiled in turn; ceiling: 1 / the share of an eager "
        "step in matmuls, attention and the optimiser, what fusing all the rest away could give:"
    )
    print(
        f"{'shape':44s} {'eager':>8s} {'compiled':>9s} {'ratio':>6s} {'ceiling':>8s}  "
        "each round, eager / compiled"
    )
    ratios = {}
    for name, overrides in SHAPES.items():
        timed = steps(overrides)
        eager, compiled = (statistics.median(timed[k]) for k in ("eager", "compiled"))
        ratios[name] = eager / compiled
        ceiling = 1 / kernel_share(load_config(TrainJobConfig, CONFIG, list(overrides)))
        rounds = ", ".join(f"{e:.2f}/{c:.2f}" for e, c in zip(timed["eager"], timed["compiled"]))
        print(f"{name:44s} {eager:8.2f} {compiled:9.2f} {ratios[name]:5.2f}x {ceiling:7.2f}x  {rounds}")
        if name.startswith("tiny"):
            tiny_eager_ms = eager
    cost = call_cost_us()
    layers = load_config(TrainJobConfig, CONFIG).model.num_layers
    share = 2 * layers * cost / 1e3 / tiny_eager_ms
    print(
        "a compiled layer call's own cost (forward + backward on one token, compiled - eager): "
        f"{cost:.0f} us; x {2 * layers} calls per tiny step = {share:.0%} of its eager step "
        f"({tiny_eager_ms:.2f} ms)"
    )
    paying = [name for name, ratio in ratios.items() if ratio >= BAR]
    print(f"compiling pays {BAR}x from: {paying[0] if paying else 'no shape measured'}\n")
    tiny = next(name for name in ratios if name.startswith("tiny"))
    return print_bars(
        [
            (
                "compiled vs eager, a dp=2 rank's step of train_lm_tiny",
                f"{ratios[tiny]:.2f}x (compiled call's own cost {share:.0%} of the step)",
                f">= {BAR}x",
                ratios[tiny] >= BAR,
            )
        ],
        "target",
    )


if __name__ == "__main__":
    sys.exit(main())
