"""MoE benchmarks, side by side in one run on this machine.

    .venv/bin/python bench/moe.py

1. Compute follows k: forward time of one MoE layer (16 experts) with top-1 sparse dispatch
   against running all 16 experts densely and masking by the gate.
2. An MoE classifier (8 experts, top-2) against a dense model with the same active parameters
   (same stem, one expert twice as wide), trained the same way on MNIST-1D over three seeds:
   test accuracy and step time.

Ends with each target beside its measurement (met / missed); exit status 1 if one was missed:
sparse / dense forward time < 0.5; MoE / dense step time <= 1.5; MoE at least as accurate as the
dense model with the same active parameters (mean test accuracy over the seeds, MoE - dense >= 0).
"""

import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "platform")]

from bars import print_bars  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge.data import load_mnist1d  # noqa: E402
from scaleforge.models import MoESpec, build_model, count_parameters  # noqa: E402
from scaleforge.models.moe import MoELayer, dense_forward, expert_load, moe_layers  # noqa: E402


def best_time(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def compute_follows_k() -> tuple[float, float]:
    torch.manual_seed(0)
    layer = MoELayer(MoESpec(d_model=256, num_experts=16, expert_hidden=1024, top_k=1)).eval()
    x = torch.randn(2048, 256)
    with torch.no_grad():
        layer(x), dense_forward(layer, x)  # warm-up
        return best_time(lambda: layer(x)), best_time(lambda: dense_forward(layer, x))


def train(spec: MoESpec, data, seed: int, epochs: int = 25, batch: int = 512, lr: float = 3e-3) -> dict:
    torch.manual_seed(seed)
    model = build_model(spec, 40, 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    steps = epochs * -(-len(x) // batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps)
    step_times = []
    for _ in range(epochs):
        for layer in moe_layers(model):
            layer.reset_stats()
        model.train()
        order = torch.randperm(len(x))
        for i in range(0, len(x), batch):
            rows = order[i : i + batch]
            start = time.perf_counter()
            loss = F.cross_entropy(model(x[rows]), y[rows]) + model.aux_loss()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step_times.append(time.perf_counter() - start)
            schedule.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(data["x_test"])).argmax(1).numpy() == data["y_test"]).mean()
    active = (
        count_parameters(model)
        - sum(count_parameters(e) for layer in moe_layers(model) for e in layer.experts)
        + sum(count_parameters(layer.experts[0]) * spec.top_k for layer in moe_layers(model))
    )
    return {
        "accuracy": float(accuracy),
        "step_ms": 1e3 * float(np.median(step_times)),
        "params": count_parameters(model),
        "active": active,
        "cv": expert_load(model)["load_cv"],
    }


def main() -> int:
    check_and_print()
    torch.set_num_threads(1)
    sparse, dense = compute_follows_k()
    print("1. One MoE layer, 16 experts (d=256, hidden=1024), 2048 tokens, forward")
    print(
        f"   top-1 sparse dispatch {sparse * 1e3:8.1f} ms | all 16 experts dense {dense * 1e3:8.1f} ms"
        f" | ratio {sparse / dense:.2f} (target < 0.5)"
    )

    data = load_mnist1d(20_000, 42, 0.2, "~/.cache/scaleforge")
    # A small stem, so that the block after it (experts or dense MLP) decides the accuracy.
    stem = dict(stem_channels=[8, 8], d_model=32)
    specs = {
        "MoE: 8 experts x 32, top-2": MoESpec(
            **stem, num_experts=8, expert_hidden=32, top_k=2, aux_loss_weight=0.02
        ),
        "dense: 1 expert x 64": MoESpec(
            **stem, num_experts=1, expert_hidden=64, top_k=1, aux_loss_weight=0.0
        ),
    }
    seeds = (0, 1, 2)
    runs = {name: [train(spec, data, seed) for seed in seeds] for name, spec in specs.items()}
    print(f"\n2. MNIST-1D (16k train / 4k test), 25 epochs, batch 512, seeds {seeds}, same schedule")
    print(f"   {'model':28s} {'params':>8s} {'active':>8s} {'test acc (mean, min-max)':>26s} {'step ms':>8s}")
    summary = {}
    for name, results in runs.items():
        accuracy = [r["accuracy"] for r in results]
        step = float(np.median([r["step_ms"] for r in results]))
        summary[name] = (float(np.mean(accuracy)), step)
        print(
            f"   {name:28s} {results[0]['params']:8,d} {results[0]['active']:8,d} "
            f"{np.mean(accuracy):10.4f} ({min(accuracy):.4f}-{max(accuracy):.4f}) {step:8.2f}"
        )
    (moe_acc, moe_step), (dense_acc, dense_step) = summary.values()
    print(
        f"   MoE - dense accuracy: {100 * (moe_acc - dense_acc):+.2f} points (mean of {len(seeds)} seeds); "
        f"step-time ratio {moe_step / dense_step:.2f} (target <= 1.5)"
    )
    print()
    return print_bars(
        [
            (
                "1. forward, top-1 sparse / all 16 experts dense",
                f"{sparse * 1e3:.1f} / {dense * 1e3:.1f} ms = {sparse / dense:.2f}",
                "< 0.5",
                sparse / dense < 0.5,
            ),
            (
                "2. step time, MoE / dense (same active params)",
                f"{moe_step:.2f} / {dense_step:.2f} ms = {moe_step / dense_step:.2f}",
                "<= 1.5",
                moe_step / dense_step <= 1.5,
            ),
            (
                f"2. test accuracy, MoE - dense (mean of {len(seeds)} seeds)",
                f"{moe_acc:.4f} - {dense_acc:.4f} = {100 * (moe_acc - dense_acc):+.2f} points",
                ">= 0 points",
                moe_acc >= dense_acc,
            ),
        ],
        "MoE",
    )


if __name__ == "__main__":
    sys.exit(main())
