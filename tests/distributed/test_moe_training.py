"""MoE training on Ray Train: load balancing, the noisy and Gumbel gates, expert parallelism."""

import pytest

from conftest import REPO
from scaleforge.artifacts import load_artifact
from scaleforge.config import TrainJobConfig, load_config
from scaleforge.train import run_training


def _train(tmp_path, *overrides):
    cfg = load_config(TrainJobConfig, REPO / "configs/train_moe.yaml",
                      [f"run.storage_path={tmp_path / 'runs'}", f"artifact.dir={tmp_path / 'artifact'}", *overrides])
    return run_training(cfg)


@pytest.mark.slow
def test_balancing_loss_keeps_expert_load_even(ray_cluster, tmp_path):
    balanced = _train(tmp_path / "with")
    unbalanced = _train(tmp_path / "without", "model.aux_loss_weight=0")
    print(f"expert load CV: {balanced.metrics['expert_load_cv']:.3f} with the loss, "
          f"{unbalanced.metrics['expert_load_cv']:.3f} without")
    assert balanced.metrics["expert_load_cv"] <= 0.3
    assert unbalanced.metrics["expert_load_cv"] > balanced.metrics["expert_load_cv"]
    assert balanced.metrics["test_accuracy"] >= 0.92


@pytest.mark.slow
@pytest.mark.parametrize("gate", ["noisy_topk", "gumbel"])
def test_noisy_and_gumbel_gates_train(ray_cluster, tmp_path, gate):
    assert _train(tmp_path, f"model.gate={gate}").metrics["test_accuracy"] >= 0.92


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
