"""Every impossible parallel layout is one clear config error, before Ray starts."""

import os
import subprocess
import sys

import pytest
from conftest import REPO

from scaleforge.config import ConfigError, TrainJobConfig, load_config

TP = REPO / "configs/train_tp.yaml"  # transformer, 4 heads, 3 layers, ff_dim 128, 2 workers, tp=2
CASES = {
    ("parallel.dp=2",): "parallel.dp (2) * fsdp (1) * tp (2) * pp (1) = 4 must equal scaling.num_workers (2)",
    ("parallel.tp=4",): "parallel.fsdp (1) * tp (4) * pp (1) = 4 must divide scaling.num_workers (2)",
    ("scaling.num_workers=3", "parallel.tp=3"): "parallel.tp (3) must divide model.num_heads (4)",
    ("model.ff_dim=99",): "parallel.tp (2) must divide model.ff_dim (99)",
    (
        "scaling.num_workers=4",
        "parallel.tp=1",
        "parallel.pp=4",
    ): "parallel.pp (4) must be at most model.num_layers (3): each pipeline stage holds whole layers",
    ("model={name: cnn1d}",): "parallel.tp (2) needs model.name=transformer or transformer_lm, not cnn1d",
    (
        "model={name: mlp}",
        "parallel.tp=1",
        "parallel.pp=2",
    ): "parallel.pp (2) needs model.name=transformer or transformer_lm, not mlp",
    ("scaling.num_workers=4", "parallel.pp=2"): "parallel: tp (2) and pp (2) do not combine",
    (
        "scaling.num_workers=4",
        "parallel.tp=1",
        "parallel.fsdp=2",
        "parallel.pp=2",
    ): "parallel: fsdp (2) and pp (2) do not combine",
    (
        "parallel.tp=1",
        "parallel.pp=2",
        "parallel.microbatches=3",
    ): "parallel.microbatches (3) must divide optim.batch_size (512)",
    (
        "parallel.tp=1",
        "parallel.pp=2",
        "parallel.microbatches=1",
    ): "parallel.pp_schedule=1f1b needs parallel.microbatches (1) >= parallel.pp (2)",
    ("model.moe={num_experts: 4}",): "parallel.tp needs a dense model; MoE layers split with parallel.ep",
    (
        "scaling.num_workers=4",
        "model.moe={num_experts: 4}",
        "parallel.ep=2",
    ): "parallel.ep (2) combines with data parallelism only, not with parallel.fsdp, tp or pp",
}


@pytest.mark.parametrize("overrides", list(CASES), ids=[" ".join(o) for o in CASES])
def test_impossible_layout_is_a_clear_config_error(overrides):
    with pytest.raises(ConfigError) as error:
        load_config(TrainJobConfig, TP, list(overrides))
    assert CASES[overrides] in str(error.value)


def test_possible_layouts_fill_in_the_data_parallel_degree():
    """The layout object resolves ``dp`` from the workers; the config the user wrote stays as written."""
    tp = load_config(TrainJobConfig, TP, [])
    assert tp.parallel.dp is None and tp.dims.dp == 1
    dp_tp = load_config(TrainJobConfig, TP, ["scaling.num_workers=4"]).dims
    assert (dp_tp.dp, dp_tp.tp, dp_tp.world_size) == (2, 2, 4)
    fsdp_tp = load_config(TrainJobConfig, TP, ["scaling.num_workers=4", "parallel.fsdp=2"]).dims
    assert (fsdp_tp.dp, fsdp_tp.fsdp, fsdp_tp.tp, fsdp_tp.data_world) == (1, 2, 2, 2)
    assert fsdp_tp.describe() == "fsdp=2 x tp=2" and fsdp_tp.model_split
    assert load_config(TrainJobConfig, REPO / "configs/train_dp.yaml", []).dims.dp == 2


def test_layout_error_exits_2_without_starting_ray(tmp_path):
    env = {**os.environ, "RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.train", "--config", "configs/train_tp.yaml", "--set", "parallel.tp=4"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: configs/train_tp.yaml (with --set parallel.tp=4): parallel.fsdp (1) "
        "* tp (4) * pp (1) = 4 must divide scaling.num_workers (2)"
    )
    assert list(tmp_path.iterdir()) == []
