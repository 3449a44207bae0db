"""The main job's typed records and the serve plan it builds from them, without running a stage."""

import json
import math

import pytest
import yaml
from conftest import REPO
from ray.serve.schema import ServeDeploySchema

import jobs.pipeline
from scaleforge.cluster import free_ports
from scaleforge.config import PipelineConfig, ServeConfig, load_config
from scaleforge.config.pipeline import STAGES, ServeStageSpec
from scaleforge.config.serve import ServeArgs
from scaleforge.pipeline import Pipeline, Records
from scaleforge.pipeline.records import (
    CalibrateRecord,
    CompressRecord,
    MoERecord,
    QueryRecord,
    ServeRecord,
    TrainRecord,
)
from scaleforge.pipeline.serve import ServeStage, write_serve_yaml
from scaleforge.pipeline.serve_plan import serve_args
from scaleforge.routers import CascadeEntry, MoEEntry


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


def _calibrated(thresholds=(0.8,), **fields) -> CalibrateRecord:
    return CalibrateRecord(
        cascade="cascade",
        stages=["student", "teacher"],
        measure="max_prob",
        data={"num_samples": 100},
        thresholds=list(thresholds),
        calibration_fraction=0.5,
        split_seed=0,
        answered_per_stage=[0.0, 1.0],
        accuracy=0.9,
        last_stage_accuracy=0.9,
        held_out=50,
        curve=[{"threshold": 0.0, "escalated": 0.0, "accuracy": 0.8}],
        **fields,
    )


def test_records_survive_json_with_infinite_thresholds_and_reported_extras():
    calibrate = _calibrated([math.inf])
    assert CalibrateRecord.model_validate_json(calibrate.model_dump_json()) == calibrate
    teacher = TrainRecord.model_validate_json(_teacher().model_dump_json())
    assert teacher.history[0].epoch == 0 and teacher.history[0].model_extra == {"train_loss": 0.3}


def test_the_serve_plan_serves_this_runs_artifacts_and_thresholds(pipeline_cfg, tmp_path):
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
            parts={"gate": "/runs/moe/gate", "experts": experts, "combine": "gumbel", "top_k": 2},
        ),
        calibrate=_calibrated([0.75]),
    )
    template = load_config(ServeConfig, "configs/serve.yaml")
    args = serve_args(template.applications[0].args, pipeline_cfg.serve, records)
    assert {m.name: m.artifact for m in args.models} == {
        "student": "/runs/student",
        "teacher": "/runs/teacher",
        "moe-gate": "/runs/moe/gate",
        **{f"moe-expert-{i}": e for i, e in enumerate(experts)},
    }
    (moe,), (cascade,) = args.routers_of(MoEEntry), args.routers_of(CascadeEntry)
    assert moe.experts == [f"moe-expert-{i}" for i in range(4)] and moe.top_k == 2
    assert moe.combine == "gumbel"  # the gate family the experts were trained with
    assert [(s.model, s.threshold) for s in cascade.stages] == [("student", 0.75), ("teacher", None)]
    # What configs/serve.yaml sets is kept: both cascade stages inside each of its ingress replicas.
    assert (
        args.model("teacher").in_ingress
        and args.ingress.replicas == template.applications[0].args.ingress.replicas
    )
    # Written as the serve stage writes it: a file Ray's own schema and ours accept, thresholds and all.
    app = template.applications[0].model_copy(update={"args": args})
    path = write_serve_yaml(
        str(tmp_path / "serve.yaml"), template.model_copy(update={"applications": [app]}), ""
    )
    ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    written = load_config(ServeConfig, path).applications[0].args
    assert written.routers_of(CascadeEntry)[0].thresholds == [0.75]


def test_served_names_come_from_the_pipeline_config(pipeline_cfg):
    """Renamed served models and router: the plan serves them under the names the pipeline config gives,
    and a name that ``serve.config`` has no entry for is refused, naming it."""
    records = Records(
        teacher=_teacher(),
        compress=CompressRecord(
            artifact="/runs/student",
            output="/runs/compressed",
            report={
                "teacher": {"bytes": 1, "accuracy": 0.9, "vs_teacher": {"smaller": 1.0, "speedup": {}}},
                "recipe": [{"bytes": 1, "accuracy": 0.9, "vs_teacher": {"smaller": 1.0, "speedup": {}}}],
            },
        ),
        moe=MoERecord(
            **_teacher("/runs/moe").model_dump(),
            parts={
                "gate": "/runs/moe/gate",
                "experts": ["/runs/e0", "/runs/e1"],
                "combine": "topk",
                "top_k": 2,
            },
        ),
        calibrate=_calibrated().model_copy(update={"cascade": "cheap-first", "stages": ["small", "big"]}),
    )
    spec = ServeStageSpec.model_validate(
        {
            "config": "configs/serve.yaml",
            "models": {"big": "teacher", "small": "compress"},
            "cascade": {"name": "cheap-first", "stages": ["small", "big"]},
            "moe": {"name": "moe", "gate": "router", "expert_prefix": "e"},
        }
    )
    template = load_config(ServeConfig, "configs/serve.yaml").applications[0].args
    with pytest.raises(ValueError, match=r"no model entries named \['big', 'e0', 'e1', 'router', 'small'\]"):
        serve_args(template, spec, records)
    names = {
        "teacher": "big",
        "student": "small",
        "moe-gate": "router",
        "moe-expert-0": "e0",
        "moe-expert-1": "e1",
    }
    renamed = template.model_copy(
        update={"models": [m.model_copy(update={"name": names.get(m.name, m.name)}) for m in template.models]}
    )
    args = ServeArgs.model_validate(serve_args(renamed, spec, records).model_dump())
    assert {m.name: m.artifact for m in args.models} == {
        "big": "/runs/teacher",
        "small": "/runs/student",
        "router": "/runs/moe/gate",
        "e0": "/runs/e0",
        "e1": "/runs/e1",
    }
    (cascade,), (moe,) = args.routers_of(CascadeEntry), args.routers_of(MoEEntry)
    assert [s.model for s in cascade.stages] == ["small", "big"] and cascade.name == "cheap-first"
    assert (moe.gate, moe.experts) == ("router", ["e0", "e1"])
    assert spec.endpoints == ["big", "small", "cheap-first", "moe"]
    with pytest.raises(ValueError, match="serve.cascade.stages: tiny not among serve.models"):
        ServeStageSpec.model_validate({"config": "c.yaml", "cascade": {"stages": ["tiny", "teacher"]}})


def test_the_served_models_are_scored_only_on_inputs_the_calibration_never_saw():
    """The query stage's test set is the part of the held-out split that calibration did not use."""
    from scaleforge.calibrate import held_out_split
    from scaleforge.data import DataSpec, load_arrays
    from scaleforge.pipeline.query import test_set

    data = DataSpec(num_samples=1000)
    calibrate = _calibrated().model_copy(update={"data": data, "split_seed": 3})
    split = held_out_split(data, 0.5, 3)
    (calibration_x, _), (judged_x, judged_y) = split.calibration, split.judged
    x, y = test_set(calibrate)
    assert len(y) == len(judged_y) == len(load_arrays(data).y_test) - len(calibration_x) == 100
    assert (x == judged_x).all() and (y == judged_y).all()
    seen = {row.tobytes() for row in calibration_x}
    assert not any(row.tobytes() in seen for row in x)


def _queried() -> QueryRecord:
    result = {"accuracy": 0.9, "p50_ms": 1.0, "p99_ms": 2.0, "inputs_per_s": 100.0}
    return QueryRecord(
        url="http://127.0.0.1:1",
        inputs=10,
        placement={"enabled": False},
        models={"teacher": result},
        pipeline_wall_s=1.0,
    )


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
    # A run that ends with Serve left up (--to serve) serves again too; one that only writes the
    # report from the records (--from report) reuses the record as it is, and runs nothing else.
    assert "serve" not in Pipeline(pipeline_cfg, stop_after="serve", log=print)._reused
    (tmp_path / "records" / "query.json").write_text(_queried().model_dump_json())
    from_report = Pipeline(pipeline_cfg, redo_from="report", log=logged.append)
    assert {"teacher", "serve", "query"} <= set(from_report._reused) and len(logged) == 1
    assert [stage.name for stage in from_report.to_run] == [
        "async_sgd",
        "compress",
        "moe",
        "calibrate",
        "report",
    ]


def test_the_cascade_line_gives_the_median_of_the_pass_by_pass_ratios():
    """Each pass queried both models one after the other: the ratio is taken within a pass (3.0x, 1.0x,
    3.0x here: median 3.0x), not between the medians of each model's passes (300 / 110 = 2.73x)."""
    from scaleforge.pipeline.records import ServedModelResult
    from scaleforge.pipeline.report import cascade_against_last_stage

    latency = {"p50_ms": 1.0, "p99_ms": 2.0}
    cascade = ServedModelResult(
        accuracy=0.98, inputs_per_s=300.0, inputs_per_s_per_pass=[300.0, 200.0, 330.0], **latency
    )
    teacher = ServedModelResult(
        accuracy=0.99, inputs_per_s=110.0, inputs_per_s_per_pass=[100.0, 200.0, 110.0], **latency
    )
    assert cascade_against_last_stage(cascade, teacher, "teacher") == (
        "cascade against the teacher: 3.00x the inputs/s (median of 3 passes: 3.00x 1.00x 3.00x), "
        "accuracy -0.0100"
    )
    one_pass = ServedModelResult(accuracy=0.99, inputs_per_s=150.0, **latency)
    assert cascade_against_last_stage(cascade, one_pass, "teacher").startswith(
        "cascade against the teacher: 2.00x the inputs/s, accuracy"
    )
