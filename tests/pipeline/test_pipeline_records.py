"""The main job's typed records and the Serve config it writes, without running a stage."""

import json
import math
import time

import pytest
import yaml
from conftest import REPO
from ray.serve.schema import ServeDeploySchema

import jobs.pipeline
from scaleforge.cluster import free_ports
from scaleforge.config import PipelineConfig, ServeConfig, load_config
from scaleforge.config.pipeline import STAGES
from scaleforge.config.routers import MoEEntry
from scaleforge.pipeline import Pipeline, Records
from scaleforge.pipeline.base import StageContext
from scaleforge.pipeline.records import CalibrateRecord, CompressRecord, MoERecord, ServeRecord, TrainRecord
from scaleforge.pipeline.serve import ServeStage
from scaleforge.pipeline.stages import write_serve_config


@pytest.fixture
def pipeline_cfg(tmp_path, monkeypatch) -> PipelineConfig:
    monkeypatch.chdir(REPO)  # the stage config paths in configs/pipeline.yaml are relative to the repository
    return load_config(PipelineConfig, "configs/pipeline.yaml", [f"output={tmp_path}"])


def _teacher(artifact="/runs/teacher") -> TrainRecord:
    return TrainRecord(
        artifact=artifact,
        metrics={"test_accuracy": 0.9},
        parameters=1000,
        history=[{"epoch": 0, "test_accuracy": 0.9, "train_loss": 0.3}],
    )


def test_a_record_with_a_renamed_field_fails_before_any_stage_runs(pipeline_cfg, tmp_path, capsys):
    import ray

    record = _teacher().model_dump(mode="json")
    record["artefact"] = record.pop("artifact")
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "teacher.json").write_text(json.dumps(record))
    started_before = ray.is_initialized()
    assert jobs.pipeline.main(["--config", "configs/pipeline.yaml", "--set", f"output={tmp_path}"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(
        f"error: {tmp_path / 'records' / 'teacher.json'}: artifact: Field required; "
        "artefact: Extra inputs are not permitted (redo the stage: --from teacher)"
    )
    assert ray.is_initialized() == started_before
    Pipeline(pipeline_cfg, redo_from="teacher")  # a stage that is redone is not read


def test_an_unknown_stage_after_from_is_refused(capsys):
    assert jobs.pipeline.main(["--config", "configs/pipeline.yaml", "--from", "train"]) == 2
    assert (
        f"error: argument --from: invalid choice: 'train' (choose from {', '.join(map(repr, STAGES))})"
        in (capsys.readouterr().err)
    )


def test_records_survive_json_with_infinite_thresholds_and_reported_extras():
    calibrate = CalibrateRecord(
        serve_config="serve.yaml",
        data={"num_samples": 100},
        thresholds=[math.inf],
        calibration_fraction=0.5,
        split_seed=0,
        answered_per_stage=[0.0, 1.0],
        accuracy=0.9,
        last_stage_accuracy=0.9,
        held_out=50,
    )
    assert CalibrateRecord.model_validate_json(calibrate.model_dump_json()) == calibrate
    teacher = TrainRecord.model_validate_json(_teacher().model_dump_json())
    assert teacher.history[0].epoch == 0 and teacher.history[0].model_extra == {"train_loss": 0.3}


def test_the_run_serve_config_serves_this_runs_artifacts(pipeline_cfg, tmp_path):
    experts = [f"/runs/moe/expert-{i}" for i in range(4)]  # the tiny test trains 4 of configs/serve.yaml's 8
    report = {
        "teacher": {"bytes": 1000, "accuracy": 0.9, "vs_teacher": {"smaller": 1.0, "speedup": {"64": 1.0}}}
    }
    records = Records(
        teacher=_teacher(),
        compress=CompressRecord(
            artifact="/runs/student",
            output="/runs/compressed",
            report={**report, "recipe": [report["teacher"]]},
        ),
        moe=MoERecord(
            **_teacher("/runs/moe").model_dump(),
            parts={"gate": "/runs/moe/gate", "experts": experts, "combine": "topk", "top_k": 2},
        ),
    )
    ctx = StageContext(pipeline_cfg, tmp_path, records, print, time.perf_counter())
    path = write_serve_config(ctx)
    text = path.read_text()
    assert text.startswith("# ray serve config written by jobs.pipeline from configs/serve.yaml\n")
    ServeDeploySchema.model_validate(yaml.safe_load(text))
    args = load_config(ServeConfig, path).applications[0].args
    assert {m.name: m.artifact for m in args.models} == {
        "student": "/runs/student",
        "teacher": "/runs/teacher",
        "moe-gate": "/runs/moe/gate",
        **{f"moe-expert-{i}": e for i, e in enumerate(experts)},
    }
    moe = args.routers_of(MoEEntry)[0]
    assert moe.experts == [f"moe-expert-{i}" for i in range(4)] and moe.top_k == 2
    assert args.model("teacher").autoscaling.max_replicas == 2  # what configs/serve.yaml sets is kept


def test_the_served_models_are_scored_only_on_inputs_the_calibration_never_saw():
    """The query stage's test set is the part of the held-out split that calibration did not use."""
    from scaleforge.config.calibrate import CalibrateConfig
    from scaleforge.data import DataSpec, load_arrays
    from scaleforge.pipeline.query import test_set
    from scaleforge.routing.calibration import _split

    data = DataSpec(num_samples=1000)
    cfg = CalibrateConfig(data=data, calibration_fraction=0.5, split_seed=3)
    calibrate = CalibrateRecord(
        serve_config="serve.yaml",
        data=data,
        calibration_fraction=0.5,
        split_seed=3,
        thresholds=[0.8],
        answered_per_stage=[0.9, 0.1],
        accuracy=0.9,
        last_stage_accuracy=0.9,
        held_out=100,
    )
    (calibration_x, _), (judged_x, judged_y) = _split(cfg)
    x, y = test_set(calibrate)
    assert len(y) == len(judged_y) == len(load_arrays(data).y_test) - len(calibration_x) == 100
    assert (x == judged_x).all() and (y == judged_y).all()
    seen = {row.tobytes() for row in calibration_x}
    assert not any(row.tobytes() in seen for row in x)


def test_to_before_from_is_refused_before_ray_starts(capsys):
    import ray

    started_before = ray.is_initialized()
    assert (
        jobs.pipeline.main(["--config", "configs/pipeline.yaml", "--from", "compress", "--to", "teacher"])
        == 2
    )
    assert capsys.readouterr().err.startswith(
        "error: --to teacher comes before --from compress (stages: teacher, "
    )
    assert ray.is_initialized() == started_before


def test_a_recorded_serve_endpoint_is_reused_only_while_it_answers(pipeline_cfg, tmp_path):
    """``--to serve`` leaves Serve up for a later ``--from query``; an endpoint that no longer answers
    (a run that ended deleted its apps) is served again instead of being queried."""
    (port,) = free_ports(1)  # nothing listens there
    dead = ServeRecord(url=f"http://127.0.0.1:{port}", placement={"enabled": False})
    assert ServeStage.stale(dead) == f"http://127.0.0.1:{port} does not answer (ConnectError)"
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "teacher.json").write_text(_teacher().model_dump_json())
    (tmp_path / "records" / "serve.json").write_text(dead.model_dump_json())
    logged = []
    pipeline = Pipeline(pipeline_cfg, log=logged.append)
    assert set(pipeline._reused) == {"teacher"}
    assert logged == [f"[pipeline] serve: not reused, http://127.0.0.1:{port} does not answer (ConnectError)"]
    assert [stage.name for stage in Pipeline(pipeline_cfg, stop_after="serve").stages] == list(STAGES[:6])
