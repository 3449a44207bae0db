"""Step checkpoints of the language model split over a mesh: a run killed between two checkpoints
resumes from the sharded one with the next unseen batch, under FSDP and under pipeline parallelism,
and exports the whole model."""

import re

import numpy as np
import pytest
from conftest import REPO
from step_resume import assert_resumed_at_the_next_unseen_batch

from scaleforge.artifacts import load_artifact
from scaleforge.config import TrainJobConfig, load_config
from scaleforge.config.loader import ConfigError
from scaleforge.quickfit import bits_per_byte
from scaleforge.text.corpus import load_corpus
from scaleforge.text.dataset import windows
from scaleforge.text.tokenizer import tokenizer_from_json
from scaleforge.train import run_training


@pytest.mark.slow
@pytest.mark.parametrize(
    "split, levers, kill",
    [
        # 14 steps an epoch: 4 batches of 16 rows a step (2 ranks x 2 accumulated)
        ("fsdp", ["optim.accumulate_steps=2"], 25),
        # BPE tokens of 512 ids (2.15 bytes each): 27 steps an epoch
        (
            "pp",
            ["parallel.activation_checkpointing=selective", "data.tokenizer=bpe", "data.vocab_size=512"],
            35,
        ),
    ],
)
def test_the_split_language_model_resumes_at_the_next_unseen_batch(
    ray_cluster, tmp_path, split, levers, kill
):
    """Also the levers of a model that does not fit (``optim.accumulate_steps``,
    ``parallel.activation_checkpointing``) through Ray Train, their numerics against one process being
    ``tests/distributed/test_lm_parallel.py``'s; and subword tokens (``data.tokenizer: bpe``): the
    artifact's own tokenizer, rebuilt from its manifest, scores held-out bytes as the job did."""
    cfg = load_config(
        TrainJobConfig,
        REPO / "configs/train_lm_tiny.yaml",
        [
            f"storage={tmp_path}",
            f"parallel.{split}=2",
            "data.max_train_bytes=60000",
            "data.max_validation_bytes=10000",
            "optim.epochs=2",
            "run.checkpoint_every_steps=10",
            f"fault.kill_worker_at_step={kill}",
            *levers,
        ],
    )
    result = run_training(cfg)
    assert_resumed_at_the_next_unseen_batch(result, every=10, kill=kill)
    assert result.history[-1]["bits_per_byte"] < result.history[0]["bits_per_byte"] < 5.0
    # 16 rows x 2 ranks x 2 accumulated under fsdp
    assert result.step_log[0]["global_batch"] == cfg.optim.batch_size * cfg.global_slices
    assert "[memory] rank 1:" in result.summary()  # what each rank of the split holds
    artifact = load_artifact(result.artifact)
    assert artifact.manifest["training"]["parallel"][split] == 2
    if split == "pp":  # both stages, gathered into one model in this process, score what they scored together
        tokenizer = tokenizer_from_json(artifact.manifest["tokenizer"])
        assert artifact.manifest["tokenizer"]["type"] == "bpe" and tokenizer.vocab_size == 512
        validation = load_corpus().read("validation")[: cfg.data.max_validation_bytes]
        tokens = tokenizer.encode(validation)
        x, y = windows(tokens.astype(np.int64), cfg.data.seq_len)
        scored = bits_per_byte(artifact.model, x, y, bytes_per_token=len(validation) / len(tokens))
        assert scored == pytest.approx(result.metrics["bits_per_byte"], abs=1e-4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["fault.kill_worker_at_step=5"], "must come after the first step checkpoint"),
        (
            ["run.checkpoint_every_steps=10", "fault.kill_worker_at_step=10"],
            "fault.kill_worker_at_step (10) must come after the first step checkpoint "
            "(run.checkpoint_every_steps=10)",
        ),
        (
            ["run.checkpoint_every_steps=10", "fault.kill_worker_at_step=11", "run.max_failures=0"],
            "needs run.max_failures >= 1",
        ),
    ],
)
def test_a_step_fault_that_cannot_be_recovered_from_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(TrainJobConfig, REPO / "configs/train_lm_tiny.yaml", overrides)
