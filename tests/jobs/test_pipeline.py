"""The main job end to end with a tiny config: every stage, real Serve, real HTTP; a failed stage
keeps what came before and ``--from`` resumes there; ``jobs.serve`` of the serve config it wrote is
ready within 2 minutes.

Its storage is a bucket of a real S3 server: the failed run, the resumed run and ``jobs.serve`` are
three processes with a home and a cache folder each, so they share nothing on disk, as the nodes of
a cluster do not; afterwards no artifact or checkpoint file exists outside the bucket and the caches."""

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from conftest import REPO
from scaleforge import storage

TINY = [
    "--set", "teacher.set=[data.num_samples=3000, optim.epochs=1, scaling.num_workers=1]",
    "--set", "async_sgd.set=[data.num_samples=3000, workers.epochs=1, run.eval_every_s=0.5]",
    "--set", "async_sgd.modes=[async]",
    "--set", "compress.set=[data.num_samples=3000, recipe.0.optim.epochs=1, recipe.0.compare_hard_labels=false, "
             "'sweeps=[]', measure.repeats=2, scaling.num_workers=1]",
    "--set", "moe.set=[data.num_samples=3000, optim.epochs=1, model.num_experts=2, scaling.num_workers=1]",  # 2 experts
    "--set", "calibrate.set=[data.num_samples=3000]",
    "--set", "query.max_inputs=128",
]


RAY_INTERNALS = (
    "Reporting training result", "TrainingReport(", "execution finished", "Progress bars disabled", "core_worker.cc",
    "eprecat", "max_ongoing_requests", "not writable", "(raylet)", " pid=", "Started a local Ray instance",
    "INFO serve", "Traceback", "Warning",
)
"""What Ray and our own defaults used to print on a newcomer's console: it stays in Ray's log folder."""


RAY_LOG_RECORD = re.compile(r"^(DEBUG|INFO|WARNING|ERROR) \d{4}-\d\d-\d\d ")
"""A record from Ray's own loggers ("INFO 2026-12-01 02:47:41,404 serve 6049 -- Started Serve ...")."""


def _assert_console_is_ours(run) -> None:
    console = run.stdout + run.stderr
    leaked = [line for line in console.splitlines()
              if any(mark in line for mark in RAY_INTERNALS) or RAY_LOG_RECORD.match(line)]
    assert leaked == [], "\n".join(leaked[:20])


def _machine(tmp_path, name: str) -> dict[str, str]:
    """The environment of a process on a machine of its own: its own home and artifact cache."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "HOME": str(tmp_path / name / "home"), "SCALEFORGE_CACHE": str(tmp_path / name / "cache"),
            "MPLCONFIGDIR": str(tmp_path / "matplotlib")}  # matplotlib's font cache, shared to save its rebuild


def _pipeline(tmp_path, machine, output, *extra):
    return subprocess.run([sys.executable, "-m", "jobs.pipeline", "--config", "configs/pipeline.yaml",
                           "--set", f"output={output}", *TINY, *extra], cwd=REPO, capture_output=True, text=True,
                          timeout=900, env=_machine(tmp_path, machine))


@pytest.mark.slow
def test_pipeline_runs_every_stage_and_resumes_after_a_failure(tmp_path, s3):
    out = s3.uri("pipeline")
    failed = _pipeline(tmp_path, "first", out, "--set", "fault.fail_at_stage=async_sgd")
    assert failed.returncode == 1
    _assert_console_is_ours(failed)
    # Our own progress: a line per stage and per epoch (sent by the Ray Train workers through a queue).
    assert "[pipeline] 1/7 teacher: running" in failed.stdout and "[train] epoch 1/1" in failed.stdout
    assert "error: stage async_sgd failed: injected failure" in failed.stderr and "--from async_sgd" in failed.stderr
    records = storage.join(out, "records")
    assert sorted(storage.file_sizes(records)) == ["teacher.json"]
    teacher = json.loads(storage.read_text(storage.join(records, "teacher.json")))["artifact"]
    manifest = storage.join(out, "artifacts", "teacher", "manifest.json")
    manifest_before = storage.read_text(manifest)

    resumed = _pipeline(tmp_path, "second", out, "--from", "async_sgd")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    _assert_console_is_ours(resumed)
    assert "[query] cascade: requests" in resumed.stdout
    assert "teacher: reused" in resumed.stdout and "async_sgd: running" in resumed.stdout
    assert "compress: running" in resumed.stdout and "moe: running" in resumed.stdout
    assert storage.read_text(manifest) == manifest_before
    assert json.loads(storage.read_text(storage.join(records, "teacher.json")))["artifact"] == teacher

    table = resumed.stdout[resumed.stdout.index("served model"):]
    for name in ("teacher", "student", "cascade", "moe"):
        assert f"\n{name} " in table
    query = json.loads(storage.read_text(storage.join(records, "query.json")))
    assert set(query["models"]) == {"teacher", "student", "cascade", "moe"}
    assert all(row["accuracy"] > 0.2 for row in query["models"].values())  # 10 classes: chance is 0.1
    assert abs(sum(query["models"]["cascade"]["answered_per_stage"]) - 1) < 1e-6
    # Placement measured this one-node, CPU-only cluster and kept Ray's default placement.
    placement = query["placement"]
    assert (placement["cpu_nodes"], placement["gpu_nodes"]) == (1, 0) and set(placement["models"].values()) == {"any"}
    assert "one kind of node, Ray's default placement" in table
    report = storage.file_sizes(storage.join(out, "report"))
    for name in ("report.md", "training_curves.png", "sync_vs_async.png", "compression_accuracy_vs_size.png",
                 "cascade_accuracy_vs_cost.png"):
        assert report.get(name, 0) > 0, name
    _serve_job_is_ready_within_two_minutes(storage.join(out, "serve.yaml"), _machine(tmp_path, "third"))
    # Each process downloaded what it loaded into its own cache; nothing else was written locally.
    assert list((tmp_path / "third" / "cache" / "artifacts").glob("*/model.safetensors"))
    kept = [p for p in tmp_path.rglob("*") if p.suffix in (".safetensors", ".json", ".pt", ".npz", ".png", ".yaml")
            and not {"cache", ".cache", "matplotlib"} & set(p.relative_to(tmp_path).parts)]
    assert kept == [], kept


def _serve_job_is_ready_within_two_minutes(config: str, env: dict[str, str]) -> None:
    """``python -m jobs.serve`` of the config the pipeline wrote, on an embedded Ray of its own: every
    app running and answering within 2 minutes (its deployments ask for more CPUs than this machine
    has cores; the embedded cluster is sized to what they ask)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began = time.monotonic()
    job = subprocess.Popen([sys.executable, "-m", "jobs.serve", "--config", str(config),
                            "--set", f"http_options.port={port}"], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lines = []
        while not any(line.startswith("serving ") for line in lines):
            left = 120 - (time.monotonic() - began)
            assert left > 0 and job.poll() is None, "jobs.serve not serving within 120 s:\n" + "".join(lines)
            if select.select([job.stdout], [], [], left)[0]:
                lines.append(job.stdout.readline())
        ready = time.monotonic() - began
        body = {"inputs": [{"name": "input", "shape": [2, 40], "datatype": "FP32", "data": [0.1] * 80}]}
        for model in ("teacher", "cascade", "moe"):
            answer = httpx.post(f"http://127.0.0.1:{port}/v2/models/{model}/infer", json=body, timeout=60)
            assert answer.status_code == 200, (model, answer.text)
        print(f"jobs.serve ready after {ready:.0f} s")
        job.send_signal(signal.SIGINT)  # Ctrl-C: it stops within seconds, and quietly
        rest, _ = job.communicate(timeout=30)
        assert job.returncode == 0, rest
        lines += rest.splitlines(keepends=True)
        leaked = [line for line in lines if any(mark in line for mark in RAY_INTERNALS) or RAY_LOG_RECORD.match(line)]
        assert leaked == [], "".join(leaked)
    finally:
        if job.poll() is None:
            job.kill()
