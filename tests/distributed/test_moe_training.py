"""MoE training on Ray Train: load balancing, the noisy and Gumbel gates, expert parallelism."""

import pytest

from conftest import REPO
from scaleforge.artifacts import load_artifact
from scaleforge.config import TrainJobConfig, load_config
from scaleforge.data import load_mnist1d
from scaleforge.quickfit import accuracy, fit_classifier
from scaleforge.train import run_training


def _train(tmp_path, *overrides):
    cfg = load_config(TrainJobConfig, REPO / "configs/train_moe.yaml",
                      [f"run.storage_path={tmp_path / 'runs'}", f"artifact.dir={tmp_path / 'artifact'}", *overrides])
    return run_training(cfg)


@pytest.mark.slow
def test_balancing_loss_keeps_expert_load_even(ray_cluster, tmp_path):
    """The job's expert-load statistics, with the balancing loss and without (the full config's bars:
    ``bench/training.py``)."""
    small = ("data.num_samples=6000", "optim.epochs=3")
    balanced = _train(tmp_path / "with", *small)
    unbalanced = _train(tmp_path / "without", *small, "model.aux_loss_weight=0")
    print(f"expert load CV: {balanced.metrics['expert_load_cv']:.3f} with the loss, "
          f"{unbalanced.metrics['expert_load_cv']:.3f} without")
    # Measured at 0.40 against 0.63 on this data (the full config: <= 0.3, bench/training.py).
    assert balanced.metrics["expert_load_cv"] <= 0.75 * unbalanced.metrics["expert_load_cv"]
    assert balanced.metrics["test_accuracy"] >= 0.6


@pytest.mark.parametrize("gate", ["noisy_topk", "gumbel"])
def test_noisy_and_gumbel_gates_train(gate):
    """Each gate learns (one process; the job with the full config reaches 0.92: ``bench/training.py``)."""
    data = load_mnist1d(3000, 42, 0.2, "~/.cache/scaleforge")
    spec = load_config(TrainJobConfig, REPO / "configs/train_moe.yaml", [f"model.gate={gate}"]).model
    model = fit_classifier(spec, data["x"], data["y"], epochs=6, batch_size=128)
    assert accuracy(model, data["x_test"], data["y_test"]) >= 0.6


@pytest.mark.slow
def test_expert_parallel_job_trains_and_exports_the_full_model(ray_cluster, tmp_path):
    result = _train(tmp_path, "parallel.ep=2", "optim.epochs=3")
    artifact = load_artifact(result.artifact)
    assert artifact.manifest["model"]["num_experts"] == 8
    assert len(artifact.model.moe[0].experts) == 8  # gathered from both ranks
    parts = artifact.manifest["moe_parts"]
    assert load_artifact(parts["gate"]).manifest["model"]["name"] == "moe_gate"
    assert [load_artifact(p).manifest["moe_part"]["expert"] for p in parts["experts"]] == list(range(8))
    assert result.metrics["test_accuracy"] > 0.8
