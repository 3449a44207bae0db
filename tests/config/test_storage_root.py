"""``storage``: one root for a job's outputs; ``--set storage=s3://...`` moves all of them into the bucket."""

import pytest
from conftest import REPO

from scaleforge.config import AsyncSGDConfig, CompressJobConfig, PipelineConfig, TrainJobConfig, load_config

BUCKET = "s3://bucket/sf?endpoint_override=127.0.0.1:9000&scheme=http"


def _in_bucket(path: str) -> str:
    return f"s3://bucket/sf/{path}?endpoint_override=127.0.0.1:9000&scheme=http"


@pytest.mark.parametrize(
    "schema, config, expected",
    [
        (
            TrainJobConfig,
            "train_teacher.yaml",
            {"artifact.dir": "artifacts/teacher", "run.storage_path": "runs"},
        ),
        (TrainJobConfig, "train_moe.yaml", {"artifact.dir": "artifacts/moe", "run.storage_path": "runs"}),
        (
            AsyncSGDConfig,
            "async_sgd.yaml",
            {"run.output_dir": "async_sgd", "artifact.dir": "artifacts/async_sgd"},
        ),
        (
            CompressJobConfig,
            "compress.yaml",
            {"teacher": "artifacts/teacher", "output": "artifacts/compressed", "run.storage_path": "runs"},
        ),
        (
            CompressJobConfig,
            "compress_lm.yaml",
            {
                "teacher": "artifacts/lm_small",
                "output": "artifacts/compressed_lm",
                "run.storage_path": "runs",
            },
        ),
        (PipelineConfig, "pipeline.yaml", {"output": "pipeline"}),
    ],
)
def test_every_output_path_of_a_shipped_config_follows_its_storage_root(schema, config, expected):
    def value(cfg, dotted):
        for name in dotted.split("."):
            cfg = getattr(cfg, name)
        return cfg

    local = load_config(schema, REPO / "configs" / config)
    assert {field: value(local, field) for field in expected} == {
        f: f"~/scaleforge/{p}" for f, p in expected.items()
    }
    moved = load_config(schema, REPO / "configs" / config, [f"storage={BUCKET}"])
    assert {field: value(moved, field) for field in expected} == {
        f: _in_bucket(p) for f, p in expected.items()
    }


def test_a_path_given_in_full_is_kept_and_no_root_keeps_the_defaults():
    cfg = load_config(
        TrainJobConfig,
        REPO / "configs" / "train_teacher.yaml",
        [f"storage={BUCKET}", "artifact.dir=/data/teacher", "run.storage_path=gs://other/runs"],
    )
    assert (cfg.artifact.dir, cfg.run.storage_path) == ("/data/teacher", "gs://other/runs")
    assert (
        TrainJobConfig().artifact.dir == "~/scaleforge/artifacts/model"
    )  # no storage: the field's own default
    assert TrainJobConfig(storage="/srv/sf").artifact.dir == "/srv/sf/artifacts/model"
