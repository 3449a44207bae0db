"""Each training hook on its own, in one process (the Ray Train runs in tests/distributed and
tests/compress exercise them inside real jobs): every hook in scaleforge.train.hooks has a test here."""

import itertools
import re
import time

import pytest
import torch
import torch.nn.functional as F

from scaleforge.artifacts import load_artifact, save_artifact
from scaleforge.distributed import ParallelDims
from scaleforge.distributed.strategy import Batch
from scaleforge.models import MoESpec, TransformerLMSpec, build_model
from scaleforge.models.moe import moe_layers
from scaleforge.models.moe_parts import combine_parts
from scaleforge.train.hooks import (
    Distillation,
    ExpertLoad,
    FamilyExports,
    Hooks,
    KillWorker,
    TokenDistillation,
    TrainHook,
    WorkerContext,
    default_hooks,
    distillation_loss,
)
from scaleforge.train.hooks.distill import cached_teacher
from scaleforge.train.hooks.throughput import Throughput


class _Replicated:
    """What a hook sees of a one-process run: the model it trains."""

    def __init__(self, module):
        self.module = module


class _Console:
    """What rank 0's progress channel receives: the lines, in order."""

    def __init__(self):
        self.lines: list[str] = []

    def send(self, line: str) -> None:
        self.lines.append(line)


def _ctx(module=None, rank=0, world=1, start_epoch=0, steps=10, progress=None):
    return WorkerContext(
        rank=rank,
        world=world,
        start_epoch=start_epoch,
        steps_per_epoch=steps,
        model=_Replicated(module),
        progress=progress,
    )


def test_distillation_replaces_the_task_loss_with_hintons_loss():
    generator = torch.Generator().manual_seed(0)
    logits, teacher = torch.randn(8, 10, generator=generator), torch.randn(8, 10, generator=generator)
    batch = Batch(
        torch.zeros(8, 40), torch.randint(0, 10, (8,), generator=generator), {"teacher_logits": teacher}
    )
    hook = Distillation(temperature=4.0, alpha=0.7)
    loss = Hooks([hook]).loss_fn(lambda batch: 0.0)(logits, batch)
    assert loss.item() == pytest.approx(distillation_loss(logits, teacher, batch.y, 4.0, 0.7).item())
    assert loss.item() != pytest.approx(F.cross_entropy(logits, batch.y).item())
    assert Hooks([hook]).columns == {"teacher_logits": torch.float32}
    assert hook.export("unused", None, None) == {"training": {"distill": {"temperature": 4.0, "alpha": 0.7}}}
    hook.check(ParallelDims.resolve(2))  # data parallel: fine
    with pytest.raises(ValueError, match="distillation trains data-parallel only"):
        hook.check(ParallelDims.resolve(2, tp=2))
    with pytest.raises(ValueError, match="each replace the task loss"):
        Hooks([hook, Distillation(2.0, 0.5)])


def test_token_distillation_runs_the_teacher_on_every_token_of_the_batch(tmp_path):
    torch.manual_seed(0)
    spec = TransformerLMSpec(context=16, d_model=16, num_heads=2, num_layers=1, ff_dim=32, dropout=0.0)
    teacher = build_model(spec, 16, 256).eval()
    path = str(save_artifact(tmp_path / "teacher", teacher, spec, input_dim=16, num_classes=256))
    x = torch.randint(0, 256, (4, 16))
    batch, logits = Batch(x, torch.randint(0, 256, (4, 16))), torch.randn(4, 16, 256)
    hook = TokenDistillation(temperature=2.0, alpha=0.6, teacher=path)
    with torch.no_grad():
        expected = distillation_loss(
            logits.flatten(0, 1), teacher(x).flatten(0, 1), batch.y.flatten(), 2.0, 0.6
        )
    assert Hooks([hook]).loss_fn(lambda batch: 0.0)(logits, batch).item() == pytest.approx(
        expected.item(), rel=1e-5
    )
    # A student whose logits are the teacher's has no soft term: alpha 1 leaves nothing to learn.
    with torch.no_grad():
        same = teacher(x)
    assert TokenDistillation(2.0, 1.0, path).task_loss(same, batch).item() == pytest.approx(0.0, abs=1e-5)
    # The teacher is loaded once per process, not once per step; no column is precomputed for it.
    loads = cached_teacher.cache_info().misses
    hook.task_loss(logits, batch)
    assert cached_teacher.cache_info().misses == loads and Hooks([hook]).columns == {}
    assert hook.export("unused", None, None) == {"training": {"distill": {"temperature": 2.0, "alpha": 0.6}}}


def test_family_exports_of_an_moe_write_a_gate_and_experts_that_reproduce_the_model(tmp_path):
    torch.manual_seed(0)
    spec = MoESpec(stem_channels=[8], d_model=16, num_experts=3, expert_hidden=8, top_k=2)
    model = build_model(spec, 40, 10).eval()
    extra = FamilyExports().export(
        str(tmp_path / "moe"), model, spec, input_dim=40, num_classes=10, dataset={"name": "t"}
    )
    parts = extra["moe_parts"]
    assert parts["gate"] == str(tmp_path / "moe-gate") and len(parts["experts"]) == 3
    gate, experts = load_artifact(parts["gate"]), [load_artifact(p) for p in parts["experts"]]
    assert gate.manifest["moe_part"] == {"part_of": str(tmp_path / "moe"), "role": "gate"}
    x = torch.randn(16, 40)
    with torch.no_grad():
        combined = combine_parts(gate.model(x), torch.stack([e.model(x) for e in experts], dim=1), spec)
        torch.testing.assert_close(combined, model(x), atol=1e-5, rtol=1e-5)


def test_throughput_reports_rate_flops_and_mfu_every_few_steps_on_rank_0():
    console = _Console()
    hook = Throughput(every=2, items_per_step=1000, flops_per_item=6e6, unit="tokens", peak_tflops=0.5)
    ctx = _ctx(world=2, steps=8, progress=console)
    hook.on_epoch_start(ctx, 0)
    began = time.perf_counter()
    for step in range(7):
        time.sleep(0.01)
        hook.on_step(ctx, 0, step)
        hook.on_step(_ctx(rank=1, world=2, steps=8, progress=console), 0, step)  # rank 1 prints nothing
    elapsed = time.perf_counter() - began
    # The clock starts at the first step, then a line every 2 steps: at steps 2, 4 and 6.
    assert [line.split("  ")[0] for line in console.lines] == [
        f"[train] epoch 1 step {s}/8" for s in (2, 4, 6)
    ]
    for line in console.lines:
        rate, tflops, mfu = re.search(
            r"  ([\d,]+) tokens/s  ([\d.]+) model TFLOP/s  MFU ([\d.]+)%$", line
        ).groups()
        rate = float(rate.replace(",", ""))
        assert 2 * 1000 / elapsed <= rate <= 2 * 1000 / 0.02  # 2 steps of 1000 tokens, each >= 10 ms
        assert float(tflops) == pytest.approx(rate * 6e6 / 1e12, abs=1e-3)
        assert float(mfu) == pytest.approx(100 * rate * 6e6 / 1e12 / (0.5 * 2), abs=0.06)
    # A new epoch restarts the clock: evaluation between epochs is not a step.
    hook.on_epoch_start(ctx, 1)
    hook.on_step(ctx, 1, 0)
    hook.on_step(ctx, 1, 1)
    assert len(console.lines) == 3
    samples = Throughput(every=1, items_per_step=64, flops_per_item=0.0, unit="samples")
    samples.on_step(ctx, 0, 0)
    samples.on_step(ctx, 0, 1)
    assert re.fullmatch(r"\[train\] epoch 1 step 1/8  [\d,]+ samples/s", console.lines[-1])


def test_expert_load_counts_the_epochs_routing_and_resets_between_epochs():
    torch.manual_seed(0)
    model = build_model(
        MoESpec(stem_channels=[8], d_model=16, num_experts=4, expert_hidden=8, top_k=2, capacity_factor=1.0),
        40,
        10,
    )
    hook, ctx = ExpertLoad(), _ctx(model)
    hook.on_epoch_start(ctx, 0)
    model(torch.randn(64, 40))
    metrics = hook.epoch_metrics(ctx)
    layer = moe_layers(model)[0]
    assert sum(metrics["expert_counts"]) == int(layer.routed - layer.dropped) > 0
    assert metrics["expert_dropped_fraction"] == pytest.approx(float(layer.dropped / layer.routed))
    counts = torch.tensor(metrics["expert_counts"], dtype=torch.float64)
    assert metrics["expert_load_cv"] == pytest.approx(
        (counts.std(unbiased=False) / counts.mean()).item(), rel=1e-5
    )
    assert hook.summary(metrics)[0].startswith(f"expert load: cv {metrics['expert_load_cv']:.3f}")
    hook.on_epoch_start(ctx, 1)
    assert float(layer.routed) == 0 and sum(layer.expert_counts.tolist()) == 0
    assert hook.epoch_metrics(_ctx(torch.nn.Linear(2, 2))) == {} and hook.summary({}) == []  # a dense model


def test_kill_worker_fires_once_on_the_last_rank_halfway_through_its_epoch_of_the_first_attempt():
    hook, steps = KillWorker(epoch=3), 10
    fired = [
        (rank, epoch, step)
        for rank, epoch, step in itertools.product(range(2), range(4), range(steps))
        if hook.fires(_ctx(rank=rank, world=2, steps=steps), epoch, step)
    ]
    assert fired == [(1, 2, 5)]
    resumed = _ctx(rank=1, world=2, start_epoch=2, steps=steps)  # the restarted run resumes at epoch 3
    assert not any(hook.fires(resumed, epoch, step) for epoch in range(2, 4) for step in range(steps))


def test_default_hooks_follow_the_config():
    from conftest import REPO

    from scaleforge.config import TrainJobConfig, load_config

    plain = load_config(TrainJobConfig, REPO / "configs/train_dp.yaml", [])
    assert [type(h).__name__ for h in default_hooks(plain)] == ["ExpertLoad", "FamilyExports"]
    faulty = load_config(TrainJobConfig, REPO / "configs/train_dp.yaml", ["fault.kill_worker_at_epoch=4"])
    assert [h for h in default_hooks(faulty) if isinstance(h, KillWorker)] == [KillWorker(4)]
    moe = load_config(TrainJobConfig, REPO / "configs/train_moe.yaml", [])
    assert all(isinstance(h, TrainHook) for h in default_hooks(moe))


def test_family_exports_writes_what_the_models_family_exports_beside_the_artifact(tmp_path):
    """The MoE family's gate and experts (``moe_parts``), nothing for a family without exports."""
    from scaleforge.artifacts import load_artifact
    from scaleforge.models import CNN1dSpec
    from scaleforge.train.hooks import FamilyExports

    shapes = {"input_dim": 40, "num_classes": 10, "dataset": {}}
    spec = MoESpec(stem_channels=[8], d_model=16, num_experts=3, expert_hidden=8)
    entries = FamilyExports().export(str(tmp_path / "moe"), build_model(spec, 40, 10), spec, **shapes)
    assert len(entries["moe_parts"]["experts"]) == 3
    assert load_artifact(entries["moe_parts"]["gate"]).manifest["model"]["name"] == "moe_gate"
    dense = CNN1dSpec(channels=[4])
    assert FamilyExports().export(str(tmp_path / "cnn"), build_model(dense, 40, 10), dense, **shapes) == {}
