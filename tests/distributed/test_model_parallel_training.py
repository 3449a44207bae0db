"""The model-parallel job on Ray Train: a pipeline (1F1B) run that loses a worker resumes from its
sharded checkpoint, and the exported artifact is the trained model, whole, in one process."""

import pytest
import torch
from conftest import REPO

from scaleforge.artifacts import load_artifact
from scaleforge.config import TrainJobConfig, load_config
from scaleforge.data import load_arrays
from scaleforge.train import run_training


def _test_accuracy(artifact, data) -> float:
    arrays = load_arrays(data)
    with torch.no_grad():
        logits = artifact.model(torch.as_tensor(arrays.x_test, dtype=torch.float32))
    return (logits.argmax(1) == torch.as_tensor(arrays.y_test)).float().mean().item()


@pytest.mark.slow
def test_pipeline_job_resumes_from_its_sharded_checkpoint_and_exports_whole(ray_cluster, tmp_path):
    cfg = load_config(
        TrainJobConfig,
        REPO / "configs/train_tp.yaml",
        [
            "parallel.tp=1",
            "parallel.pp=2",
            "parallel.pp_schedule=1f1b",
            "data.num_samples=4000",
            "optim.epochs=2",
            "fault.kill_worker_at_epoch=2",
            f"run.storage_path={tmp_path / 'runs'}",
            f"artifact.dir={tmp_path / 'artifact'}",
        ],
    )
    result = run_training(cfg)
    assert (
        result.metrics["resumed_from_epoch"] == 1
    )  # rank 1 died in epoch 2; both stages reloaded their shards
    assert "[memory] rank 1:" in result.summary()
    artifact = load_artifact(result.artifact)
    assert artifact.manifest["training"]["parallel"]["pp"] == 2
    # The gathered artifact, in this process, scores what the two pipeline stages scored together.
    assert _test_accuracy(artifact, cfg.data) == pytest.approx(result.metrics["test_accuracy"], abs=2e-3)
    assert result.metrics["test_accuracy"] > 0.3  # 50 steps on 3,200 examples; chance is 0.1
