"""Data-parallel training on a real local Ray cluster: fault tolerance, Parquet input, a user's own hook."""

import hashlib
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray._private.state as ray_state  # the GCS's actor table (no dashboard on the test cluster)
import ray.cloudpickle
import torch
from conftest import REPO
from step_resume import assert_resumed_at_the_next_unseen_batch

from scaleforge.artifacts import load_artifact
from scaleforge.config import TrainJobConfig, load_config
from scaleforge.data import load_mnist1d
from scaleforge.storage import is_file, join, upload
from scaleforge.train import TrainHook, run_training


class ParameterNorm(TrainHook):
    """A user's own hook, one class: the L2 norm of the weights after every epoch, in the metrics."""

    def epoch_metrics(self, ctx):
        return {
            "parameter_norm": float(
                sum(p.detach().double().pow(2).sum() for p in ctx.model.module.parameters()) ** 0.5
            )
        }


# Ray's workers cannot import a test module: ship its classes by value (as for a script's __main__).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _footer_readers() -> int:
    """Ray Data's Parquet footer-reading actors this session has started (the GCS's actor table)."""
    return sum(a["ActorClassName"] == "FooterReader" for a in ray_state.actors().values())


def _config(name, tmp_path, *overrides):
    return load_config(
        TrainJobConfig,
        REPO / "configs" / name,
        [f"run.storage_path={tmp_path / 'runs'}", f"artifact.dir={tmp_path / 'artifact'}", *overrides],
    )


@pytest.mark.slow
def test_a_job_on_parquet_resumes_after_a_worker_death_from_the_buckets_checkpoint(ray_cluster, tmp_path, s3):
    """One job, as a user would run it on their own data: Parquet input, checkpoints and the artifact
    all in a bucket (a real S3 server), a hook of their own, checkpoints every 5 steps and rank 1
    killed in epoch 2, 3 steps after one. The restart loads that step's checkpoint from the bucket and
    continues with the next unseen batch: every step after it runs once, every epoch once, the hook's
    metric rides along every epoch, and the exported weights score exactly what the job reported. (The full
    config's bar and time limit through the same fault: ``bench/training.py``.)"""
    data = load_mnist1d(4000, 7, 0.2, "~/.cache/scaleforge")
    written = {}
    for split, (x, y) in {"train": (data["x"], data["y"]), "test": (data["x_test"], data["y_test"])}.items():
        pq.write_table(
            pa.table({"x": pa.array(list(x), type=pa.list_(pa.float32())), "y": pa.array(y)}),
            tmp_path / f"{split}.parquet",
        )
        written[split] = (tmp_path / f"{split}.parquet").read_bytes()
        upload(tmp_path / f"{split}.parquet", s3.uri(f"dp/data/{split}.parquet"))
    cfg = _config(
        "train_dp.yaml",
        tmp_path,
        f"data.source={s3.uri('dp/data/train.parquet')}",
        f"data.test_path={s3.uri('dp/data/test.parquet')}",
        "optim.epochs=3",  # 12 steps an epoch
        "run.checkpoint_every_steps=5",
        "fault.kill_worker_at_step=19",  # in epoch 2, 3 steps after the checkpoint of step 15
        f"run.storage_path={s3.uri('dp/runs')}",
        f"artifact.dir={s3.uri('dp/artifact')}",
    )
    footer_readers_before = _footer_readers()
    result = run_training(cfg, hooks=[ParameterNorm()])
    summary = result.summary()
    assert result.metrics["test_accuracy"] > 0.4, summary  # 10 classes: chance is 0.1; 3 epochs on 3,200
    assert f"artifact: {s3.uri('dp/artifact')}" in summary
    assert_resumed_at_the_next_unseen_batch(result, every=5, kill=19)
    run_name = result.checkpoint_path.split("/dp/runs/")[1].split("/")[0]
    assert is_file(join(s3.uri("dp/runs"), run_name, "step_log.jsonl"))  # beside the run's checkpoints
    assert [h["epoch"] for h in result.history] == [1, 2, 3], "epochs were repeated or skipped"
    assert [h["resumed_from_epoch"] for h in result.history] == [0, 1, 1]
    assert result.checkpoint_path.startswith("s3://scaleforge-test/dp/runs/train-")
    assert is_file(join(result.checkpoint_path, "trainer_state.json"))
    artifact = load_artifact(result.artifact)
    manifest = artifact.manifest
    dataset = manifest["dataset"]
    assert dataset["num_train"] == 3200 and dataset["source"] == s3.uri("dp/data/train.parquet")
    assert (
        dataset["fingerprint"] == "sha256:" + hashlib.sha256(written["train"] + written["test"]).hexdigest()
    )
    # Ray Data listed each file on one footer-reading actor (a process each), not on a pool of 32.
    assert _footer_readers() - footer_readers_before == 2
    # The exported weights reproduce the reported accuracy, and are what the hook last measured.
    with torch.no_grad():
        predicted = artifact.model(torch.from_numpy(data["x_test"])).argmax(1).numpy()
    assert (predicted == data["y_test"]).mean() == pytest.approx(result.metrics["test_accuracy"], abs=1e-9)
    assert f"test accuracy {manifest['metrics']['test_accuracy']:.4f}" in summary
    assert len({h["parameter_norm"] for h in result.history}) == 3
    assert result.metrics["parameter_norm"] == pytest.approx(
        float(sum(p.detach().double().pow(2).sum() for p in artifact.model.parameters()) ** 0.5), rel=1e-6
    )
