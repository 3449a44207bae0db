"""Every file in configs/ builds and passes its pre-flight; overrides and bad input behave as documented."""

import pytest
from conftest import REPO

from jobs.hwbench import check_runnable as check_hwbench
from scaleforge.calibrate.serve_file import check_runnable as check_calibration
from scaleforge.compress.preflight import check_runnable as check_compression
from scaleforge.config import JOB_SCHEMAS, ConfigError, TrainJobConfig, load_config
from scaleforge.config.loader import job_of
from scaleforge.paramserver.preflight import check_runnable as check_async_sgd
from scaleforge.pipeline.preflight import check_runnable as check_pipeline
from scaleforge.train.preflight import check_runnable

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
PREFLIGHTS = {
    "jobs.hwbench": check_hwbench,
    "jobs.train": check_runnable,
    "jobs.async_sgd": check_async_sgd,
    "jobs.compress": check_compression,
    "jobs.calibrate": check_calibration,
    "jobs.pipeline": check_pipeline,
}
"""Each job's pre-flight; jobs.serve checks its artifacts in serving.run."""


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_file_builds_and_passes_its_preflight(path, tmp_path):
    job = job_of(path)
    assert load_config(JOB_SCHEMAS[job], path).model_dump()  # the schema alone needs no artifact
    # The compression job starts from a trained artifact; give it one of its teacher's shape.
    overrides = [f"teacher={_teacher_artifact(tmp_path, path)}"] if job == "jobs.compress" else []
    config = load_config(JOB_SCHEMAS[job], path, overrides, preflight=PREFLIGHTS.get(job))
    assert config.model_dump()


def _teacher_artifact(folder, compress_config):
    """An untrained model of the architecture that the shipped training config writing the compression
    config's ``teacher`` trains (configs/train_teacher.yaml, configs/train_lm_small.yaml)."""
    from scaleforge.artifacts import save_artifact
    from scaleforge.data.preflight import check_data
    from scaleforge.models import build_model

    teacher = load_config(JOB_SCHEMAS["jobs.compress"], compress_config).teacher
    trainers = [load_config(TrainJobConfig, p) for p in CONFIGS if job_of(p) == "jobs.train"]
    trainer = next(cfg for cfg in trainers if cfg.artifact.dir == teacher)
    info = check_data(trainer.data)
    return save_artifact(
        folder / "teacher",
        build_model(trainer.model, info.input_dim, info.num_classes),
        trainer.model,
        input_dim=info.input_dim,
        num_classes=info.num_classes,
    )


def test_overrides_are_typed_and_nested():
    cfg = load_config(
        TrainJobConfig,
        REPO / "configs/train_dp.yaml",
        ["optim.lr=0.01", "model.channels=[8, 8]", "scaling.resources_per_worker.CPU=2", "run.name=x"],
    )
    assert cfg.optim.lr == 0.01
    assert cfg.model.channels == [8, 8]
    assert cfg.scaling.resources_per_worker == {"CPU": 2}
    assert cfg.run.name == "x"


def test_teacher_config_is_big_enough():
    from scaleforge.models import build_model, count_parameters

    cfg = load_config(TrainJobConfig, REPO / "configs/train_teacher.yaml")
    assert count_parameters(build_model(cfg.model, 40, 10)) >= 250_000


BAD = [
    ("optim.batch_size=0", "optim.batch_size: Input should be greater than 0 (got 0)"),
    ("optim.lr=-0.1", "optim.lr: Input should be greater than 0 (got -0.1)"),
    (
        "scaling.num_workers=16001",
        "scaling.num_workers (16001) is larger than the number of training examples (16000)",
    ),
    ("model.name=resnet", "model.name: unknown name 'resnet'; choose one of 'mlp', 'cnn1d', 'transformer'"),
    ("data.source=missing.npz", "data.source: data file 'missing.npz' does not exist"),
    ("optim.learning_rate=1", "optim.learning_rate: unknown key"),
    ("model.hidden=wide", "model.hidden: Input should be a valid integer"),
    ("optim.precision=fp16", "optim.precision: Input should be 'fp32' or 'bf16'"),
    ("fault.kill_worker_at_epoch=50", "fault.kill_worker_at_epoch (50) must come after the first checkpoint"),
]


@pytest.mark.parametrize("override,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_values_name_the_file_field_and_problem(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(TrainJobConfig, REPO / "configs/train_dp.yaml", [override], preflight=check_runnable)
    message = str(err.value)
    assert message.startswith(f"{REPO / 'configs/train_dp.yaml'} (with --set {override}): ")
    assert expected in message
    assert "\n" not in message


def test_unreadable_files(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("optim: [1, 2\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: invalid YAML at line \d"):
        load_config(TrainJobConfig, broken)
    with pytest.raises(ConfigError, match="nothere.yaml: config file not found"):
        load_config(TrainJobConfig, tmp_path / "nothere.yaml")
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(TrainJobConfig, listing)


def test_malformed_override():
    with pytest.raises(ConfigError, match="--set expects dotted.key=value, got 'optim.lr'"):
        load_config(TrainJobConfig, REPO / "configs/train_dp.yaml", ["optim.lr"])


def test_overrides_index_lists():
    from scaleforge.config import AsyncSGDConfig

    path = REPO / "configs/async_sgd.yaml"
    cfg = load_config(
        AsyncSGDConfig, path, ["workers.scaling=[{at_s: 5, workers: 3}]", "workers.scaling.0.workers=4"]
    )
    assert cfg.workers.scaling[0].workers == 4 and cfg.workers.scaling[0].at_s == 5
    with pytest.raises(ConfigError, match="'2' is not an index of a list of 1"):
        load_config(
            AsyncSGDConfig, path, ["workers.scaling=[{at_s: 5, workers: 3}]", "workers.scaling.2.workers=4"]
        )
