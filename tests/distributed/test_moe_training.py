"""MoE training on Ray Train: load balancing, the noisy and Gumbel gates, expert parallelism."""

import pytest
import torch
from conftest import REPO
from step_resume import assert_resumed_at_the_next_unseen_batch

from scaleforge.artifacts import load_artifact
from scaleforge.config import TrainJobConfig, load_config
from scaleforge.data import load_mnist1d
from scaleforge.models import build_model
from scaleforge.models.moe import expert_load, moe_layers
from scaleforge.quickfit import accuracy, fit, fit_classifier
from scaleforge.train import run_training


def _train(tmp_path, *overrides):
    cfg = load_config(
        TrainJobConfig,
        REPO / "configs/train_moe.yaml",
        [f"run.storage_path={tmp_path / 'runs'}", f"artifact.dir={tmp_path / 'artifact'}", *overrides],
    )
    return run_training(cfg)


@pytest.mark.slow
def test_expert_parallel_resumes_from_per_rank_optimiser_shards_and_balancing_evens_the_load(
    ray_cluster, tmp_path
):
    """Experts split over 2 workers (all_to_all), checkpoints every 10 steps, rank 1 killed in epoch 2,
    6 steps after one: the restart takes each rank's own optimiser shard, experts and data position
    from that checkpoint, and the export gathers all 8 experts.
    The same job without the balancing loss loads its experts less evenly (the full config's bars:
    ``bench/training.py``)."""
    result = _train(
        tmp_path / "with",
        "data.num_samples=6000",
        "optim.epochs=3",  # 18 steps an epoch
        "parallel.ep=2",
        "run.checkpoint_every_steps=10",
        "fault.kill_worker_at_step=27",
    )
    unbalanced_cv = _load_cv_without_the_balancing_loss(6000, epochs=3)
    assert_resumed_at_the_next_unseen_batch(result, every=10, kill=27)
    assert result.metrics["resumed_from_epoch"] == 1 and [h["epoch"] for h in result.history] == [1, 2, 3]
    artifact = load_artifact(result.artifact)
    assert artifact.manifest["model"]["num_experts"] == 8
    assert len(artifact.model.moe[0].experts) == 8  # gathered from both ranks
    parts = artifact.manifest["moe_parts"]
    assert load_artifact(parts["gate"]).manifest["model"]["name"] == "moe_gate"
    assert [load_artifact(p).manifest["moe_part"]["expert"] for p in parts["experts"]] == list(range(8))
    assert result.metrics["test_accuracy"] >= 0.5  # 10 classes: chance is 0.1
    print(
        f"expert load CV: {result.metrics['expert_load_cv']:.3f} with the loss, {unbalanced_cv:.3f} without"
    )
    assert result.metrics["expert_load_cv"] <= 0.75 * unbalanced_cv


def _load_cv_without_the_balancing_loss(num_samples: int, epochs: int) -> float:
    """The job's model and optimiser settings with ``aux_loss_weight=0``, trained in this process (the
    load statistics need no Ray Train); the expert load's CV over the last epoch, as the job measures it."""
    spec = load_config(
        TrainJobConfig,
        REPO / "configs/train_moe.yaml",
        ["model.aux_loss_weight=0", f"data.num_samples={num_samples}"],
    )
    data = load_mnist1d(num_samples, spec.data.seed, spec.data.test_fraction, spec.data.cache_dir)
    torch.manual_seed(0)
    model = build_model(spec.model, data["x"].shape[1], 10)
    fit(model, data["x"], data["y"], epochs=epochs - 1, batch_size=spec.optim.batch_size, lr=spec.optim.lr)
    for layer in moe_layers(model):
        layer.reset_stats()
    fit(model, data["x"], data["y"], epochs=1, batch_size=spec.optim.batch_size, lr=spec.optim.lr)
    return expert_load(model)["load_cv"]


@pytest.mark.parametrize("gate", ["noisy_topk", "gumbel"])
def test_noisy_and_gumbel_gates_train(gate):
    """Each gate learns (one process; the job with the full config reaches 0.92: ``bench/training.py``)."""
    data = load_mnist1d(3000, 42, 0.2, "~/.cache/scaleforge")
    spec = load_config(TrainJobConfig, REPO / "configs/train_moe.yaml", [f"model.gate={gate}"]).model
    model = fit_classifier(spec, data["x"], data["y"], epochs=6, batch_size=128)
    assert accuracy(model, data["x_test"], data["y_test"]) >= 0.6
