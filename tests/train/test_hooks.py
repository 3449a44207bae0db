"""Each training hook on its own, in one process (the Ray Train runs in tests/distributed and
tests/compress exercise them inside real jobs)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from scaleforge.distributed import ParallelDims
from scaleforge.distributed.strategy import Batch
from scaleforge.models import MoESpec, build_model
from scaleforge.models.moe import moe_layers
from scaleforge.train.hooks import (
    Distillation,
    ExpertLoad,
    Hooks,
    KillWorker,
    TrainHook,
    WorkerContext,
    default_hooks,
    distillation_loss,
)


class _Replicated:
    """What a hook sees of a one-process run: the model it trains."""

    def __init__(self, module):
        self.module = module


def _ctx(module=None, rank=0, world=1, start_epoch=0, steps=10):
    return WorkerContext(
        rank=rank,
        world=world,
        start_epoch=start_epoch,
        steps_per_epoch=steps,
        model=_Replicated(module),
        progress=None,
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
