"""One serve plan through the main job: the calibrate, serve, query and report stages run in-process on
the session's Ray over small trained models, with a ``sys.addaudithook`` watching every file opened.

The serve config is read and written once in the run: the serve stage reads ``serve.config`` once and
writes the run's ``serve.yaml`` once; calibration keeps its thresholds in its record, and the report
reads records only, so ``--from report`` rewrites it from them without touching a model or a config.
"""

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "serving"))
from serving_env import serve_args, trained_models  # noqa: E402

import jobs.pipeline  # noqa: E402
from scaleforge.config import PipelineConfig, ServeConfig, load_config  # noqa: E402
from scaleforge.config.pipeline import STAGES  # noqa: E402
from scaleforge.pipeline import Pipeline  # noqa: E402
from scaleforge.pipeline.records import (  # noqa: E402
    AsyncSGDRecord,
    CompressRecord,
    MoERecord,
    TrainRecord,
)
from scaleforge.routers import CascadeEntry, MoEEntry  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # trains the small models, deploys 8 replicas

SERVE_CONFIG = re.compile(r"serve.*\.yaml")
"""Any file that holds a serve config: the template, the run's ``serve.yaml`` and its staging file."""
OPENED: list[tuple[str, str]] = []
_WATCHING: list[bool] = []


def _audit(event: str, args: tuple) -> None:
    if event != "open" or not _WATCHING or not isinstance(args[0], (str, os.PathLike)):
        return
    mode, flags = args[1] or "", args[2] or 0
    written = any(c in mode for c in "wax+") or bool(flags & (os.O_WRONLY | os.O_RDWR))
    OPENED.append((os.fspath(args[0]), "write" if written else "read"))


sys.addaudithook(_audit)  # hooks cannot be removed: it records only while _WATCHING


class watching:
    """Record every file opened in this process (any thread) inside the ``with`` block."""

    def __enter__(self) -> list[tuple[str, str]]:
        OPENED.clear()
        _WATCHING.append(True)
        return OPENED

    def __exit__(self, *exc) -> None:
        _WATCHING.clear()


def _recorded_training(out: Path, models: dict[str, str]) -> None:
    """The records of the stages before calibrate, for the serving tests' trained artifacts."""
    history = [{"epoch": 0, "test_accuracy": 0.9}]
    trained = {"metrics": {"test_accuracy": 0.9}, "history": history, "parameters": 1000}
    experts = [models[f"moe-expert-{i}"] for i in range(4)]
    png = out / "compressed" / "accuracy_vs_size_latency.png"
    png.parent.mkdir(parents=True)
    png.write_bytes(b"\x89PNG\r\n\x1a\n")  # copied into the report as it is
    row = {
        "bytes": 1000,
        "parameters": 100,
        "accuracy": 0.9,
        "vs_teacher": {"smaller": 2.0, "speedup": {"64": 1.5}},
    }
    records = {
        "teacher": TrainRecord(artifact=models["teacher"], **trained),
        "async_sgd": AsyncSGDRecord(
            runs={
                "async": {
                    "test_accuracy": 0.8,
                    "updates": 10,
                    "wall_s": 1.0,
                    "curve": [{"seconds": 1.0, "test_accuracy": 0.8}],
                    "artifact": "/unused",
                    "plot": "/unused.png",
                }
            }
        ),
        "compress": CompressRecord(
            artifact=models["student"], output=str(png.parent), report={"teacher": row, "recipe": [row]}
        ),
        "moe": MoERecord(
            artifact=str(Path(models["moe-gate"]).parent),
            **trained,
            parts={"gate": models["moe-gate"], "experts": experts, "combine": "topk", "top_k": 2},
        ),
    }
    (out / "records").mkdir()
    for name, record in records.items():
        (out / "records" / f"{name}.json").write_text(record.model_dump_json())


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_cluster):
    """calibrate, serve, query and report in-process, watched; what was opened, and the run's config."""
    from ray import serve

    models = trained_models(tmp_path_factory)
    out = tmp_path_factory.mktemp("serve-plan")
    _recorded_training(out, models)
    template = out / "serve-template.yaml"
    app = {"name": "serve-plan", "args": serve_args(models, threshold=0.5)}
    template.write_text(yaml.safe_dump({"http_options": {"host": "127.0.0.1"}, "applications": [app]}))
    overrides = [
        f"output={out}",
        f"serve.config={template}",
        f"calibrate.config={REPO / 'configs' / 'calibrate.yaml'}",
        "placement.enabled=false",
        "query.max_inputs=128",
        "query.seconds=0",
        "query.concurrency=2",
    ]
    cfg = load_config(PipelineConfig, REPO / "configs" / "pipeline.yaml", overrides)
    try:
        with watching() as opened:
            records = Pipeline(cfg, redo_from="calibrate").run()
        yield {
            "out": out,
            "template": template,
            "opened": list(opened),
            "records": records,
            "overrides": overrides,
        }
    finally:
        serve.shutdown()


def test_one_run_reads_and_writes_the_serve_config_once(run):
    out, records = run["out"], run["records"]
    serve_configs = [(path, how) for path, how in run["opened"] if SERVE_CONFIG.search(Path(path).name)]
    # write_atomic writes a staging file beside serve.yaml and renames it over.
    assert [how for _, how in serve_configs] == ["read", "write"], serve_configs
    assert serve_configs[0][0] == str(run["template"])
    assert re.fullmatch(rf"{re.escape(str(out))}/\.serve\.yaml\.\w+\.tmp", serve_configs[1][0]), serve_configs
    assert records.serve.serve_config == str(out / "serve.yaml")
    # What was written: this run's artifacts and the calibrated thresholds, which calibration returned.
    args = load_config(ServeConfig, out / "serve.yaml").applications[0].args
    assert args.routers_of(CascadeEntry)[0].thresholds == records.calibrate.thresholds != [0.5]
    assert args.model("student").artifact == records.compress.artifact
    assert args.routers_of(MoEEntry)[0].experts == [f"moe-expert-{i}" for i in range(4)]
    # Every served endpoint answered the held-out inputs that calibration did not see.
    assert list(records.query.models) == ["teacher", "student", "cascade", "moe"]
    assert records.query.inputs == 128 and records.calibrate.held_out == 2000
    assert all(row.accuracy > 0.5 for row in records.query.models.values())  # 10 classes: chance is 0.1


def test_the_report_reads_records_only_and_from_report_rewrites_it(run, capsys):
    out = run["out"]
    report = out / "report" / "report.md"
    written = report.read_text()
    assert f"Cascade thresholds {run['records'].calibrate.thresholds}" in written
    for plot in out.glob("report/*.png"):
        plot.unlink()
    report.unlink()
    argv = ["--config", str(REPO / "configs" / "pipeline.yaml"), "--from", "report"]
    with watching() as opened:
        code = jobs.pipeline.main([*argv, *(a for o in run["overrides"] for a in ("--set", o))])
    assert code == 0, capsys.readouterr().err
    assert report.read_text() == written
    assert {p.name for p in out.glob("report/*.png")} == {
        "training_curves.png",
        "sync_vs_async.png",
        "compression_accuracy_vs_size.png",
        "cascade_accuracy_vs_cost.png",
    }
    console = capsys.readouterr().out
    assert "query: reused" in console and "serve: reused" in console and "report: running" in console
    assert "cascade against the teacher:" in console
    # It read records (and the compression plot it copies), no serve config, no model, no data.
    read = {Path(path) for path, how in opened if how == "read" and str(path).startswith(str(out))}
    recorded = {out / "records" / f"{stage}.json" for stage in STAGES[: STAGES.index("report")]}
    assert read == {*recorded, out / "compressed" / "accuracy_vs_size_latency.png"}
    assert not [p for p, _ in opened if SERVE_CONFIG.search(Path(p).name) or p.endswith(".safetensors")]
    assert json.loads((out / "records" / "report.json").read_text())["report"] == str(report)


def _router_metric_reporters() -> int:
    """Tasks in this process's Serve router thread that record the routers' metrics every 100 ms."""
    import asyncio

    from ray.serve._private.router import SingletonThreadRouter

    loop = SingletonThreadRouter._asyncio_loop
    tasks = asyncio.all_tasks(loop) if loop is not None else set()
    return sum(t.get_coro().__qualname__.endswith("_report_cached_metrics_forever") for t in tasks)


def test_a_replica_is_asked_through_a_handle_it_shuts_down_and_a_rerun_deletes_the_app_it_replaces(run):
    from ray import serve

    from scaleforge.pipeline.serve import _ask, _delete_running

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class LeftUp:
        def loaded_from(self) -> str:
            return "up"

    serve.run(LeftUp.bind(), name="left-up", route_prefix="/left-up")
    # The serve stage asks the replicas what they loaded; the handle's reporting task, left running, once
    # recorded a metric into Ray's torn-down metrics code at the driver's exit (exit code 139).
    reporters = _router_metric_reporters()
    assert _ask("LeftUp", "left-up", "loaded_from") == "up"
    assert _router_metric_reporters() == reporters
    # An app an earlier run left up (--to serve): its replicas hold CPUs and GPUs that the placement
    # measurement's tasks would wait for for ever; the new deploy replaces it anyway.
    logged = []
    _delete_running(["left-up", "not-running"], logged.append)
    assert "left-up" not in serve.status().applications
    assert logged == ["[pipeline] serve: deleting left-up (an earlier run's) to measure the cluster"]
