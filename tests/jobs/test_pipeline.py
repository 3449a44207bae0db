"""The main job end to end with a tiny config, stage by stage on a cluster whose nodes share no disk.

Its storage is a bucket of a real S3 server. The teacher stage runs as ``make demo`` runs the job
(an embedded Ray) and fails on purpose at the next stage; every later stage is then submitted with
``ray job submit`` (token authentication on) to a ``ray.cluster_utils.Cluster`` of three raylets
(a head, a CPU node and a node that declares a GPU), in two jobs (``--from async_sgd --to serve``,
``--from query``), each process with a home and an artifact cache of its own (its job's, or its
node's), as if each ran on a machine of its own; Serve stays up between the two jobs. Its replicas,
placed by the cluster's measured hardware, load their artifacts from the bucket through their own
node's cache. Afterwards no artifact or
checkpoint file exists outside the bucket and the caches, and ``jobs.serve`` of the serve config the
serve stage wrote and deployed (``serve.yaml`` in the bucket), from a machine of its own joined to the
cluster, serves every app: Serve finds them running with that config and keeps their replicas.
"""

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import httpx
import pytest
from conftest import REPO
from submitting import submit

from scaleforge import storage
from scaleforge.cluster.local import RAY
from scaleforge.cluster.machines import disk_of

TINY = [
    arg
    for override in (
        "teacher.set=[data.num_samples=3000, optim.epochs=1, scaling.num_workers=1]",
        "async_sgd.set=[data.num_samples=3000, workers.epochs=1, run.eval_every_s=0.5]",
        "async_sgd.modes=[async]",
        "compress.set=[data.num_samples=3000, recipe.0.optim.epochs=1, recipe.0.compare_hard_labels=false, "
        "'sweeps=[]', measure.repeats=2, scaling.num_workers=1]",
        # 2 experts
        "moe.set=[data.num_samples=3000, optim.epochs=1, model.num_experts=2, scaling.num_workers=1]",
        "calibrate.set=[data.num_samples=3000]",
        "serve.set=[applications.0.args.ingress.replicas=1]",
        "query.max_inputs=128",
        "query.seconds=0",
    )
    for arg in ("--set", override)
]


RAY_INTERNALS = (
    "Reporting training result",
    "TrainingReport(",
    "execution finished",
    "Progress bars disabled",
    "core_worker.cc",
    "eprecat",
    "max_ongoing_requests",
    "not writable",
    "(raylet)",
    " pid=",
    "Started a local Ray instance",
    "INFO serve",
    "Traceback",
    "Warning",
)
"""What Ray and our own defaults used to print on a newcomer's console: it stays in Ray's log folder."""


RAY_LOG_RECORD = re.compile(r"^(DEBUG|INFO|WARNING|ERROR) \d{4}-\d\d-\d\d ")
"""A record from Ray's own loggers ("INFO 2026-12-01 02:47:41,404 serve 6049 -- Started Serve ...")."""


def _assert_console_is_ours(console: str) -> None:
    leaked = [
        line
        for line in console.splitlines()
        if any(mark in line for mark in RAY_INTERNALS) or RAY_LOG_RECORD.match(line)
    ]
    assert leaked == [], "\n".join(leaked[:20])


def _machine(tmp_path, name: str) -> dict[str, str]:
    """The environment of a process on a machine of its own: its own home and artifact cache."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, **disk_of(tmp_path / name)}


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """Three raylets that share no disk (``tests/cluster/machines_cluster.py``), token auth on."""
    root = tmp_path_factory.mktemp("machines")
    nodes = {"head": {"num_cpus": 0}, "cpu": {"num_cpus": 4}, "gpu": {"num_cpus": 3, "num_gpus": 1}}
    with open(root / "cluster.log", "w") as log:
        cluster = subprocess.Popen(
            [sys.executable, "tests/cluster/machines_cluster.py", str(root / "nodes"), json.dumps(nodes)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=_machine(root, "launcher"),
        )
    try:
        line = ""
        while not line.startswith("READY "):
            assert select.select([cluster.stdout], [], [], 180)[0] and cluster.poll() is None, (
                root / "cluster.log"
            ).read_text()[-3000:]
            line = cluster.stdout.readline()
        info = json.loads(line.removeprefix("READY "))
        cli = {**_machine(root, "launcher"), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": info["token"]}
        yield {**info, "root": root / "nodes", "cli": cli}
    finally:
        cluster.stdin.close()
        try:
            cluster.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cluster.kill()


def _pipeline(tmp_path, machine, root, *extra):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "jobs.pipeline",
            "--config",
            "configs/pipeline.yaml",
            "--set",
            f"storage={root}",
            *TINY,
            *extra,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env=_machine(tmp_path, machine),
    )


def _submit(machines, tmp_path, machine, root, *extra) -> str:
    """``ray job submit`` of one run of the pipeline; the job's own logs (the driver's console) once it
    succeeded. ``machine``: the home and cache its processes get (None: those of the node it runs on)."""
    runtime_env = {"env_vars": disk_of(tmp_path / machine)} if machine else {}
    submission_id, console = submit(
        machines["dashboard"],
        machines["cli"],
        f"sf-pipeline-{machine or 'node'}",
        json.dumps(runtime_env),
        sys.executable,
        "-m",
        "jobs.pipeline",
        "--config",
        "configs/pipeline.yaml",
        "--set",
        f"storage={root}",
        *TINY,
        *extra,
        timeout=600,
    )  # the whole test: 270-750 s; one job of it past 400 s on a loaded machine (moe 237 s)
    assert f"Job '{submission_id}' succeeded" in console, console[-5000:]
    logs = _ray_job_logs(machines, submission_id)
    _assert_console_is_ours(logs)
    return logs


def _ray_job_logs(machines, submission_id: str) -> str:
    out = subprocess.run(
        [RAY, "job", "logs", "--address", machines["dashboard"], submission_id],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=machines["cli"],
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow
@pytest.mark.timeout(
    1500
)  # 270-470 s on an idle machine; 846 s in a fresh-clone run on a slow day, the suite beside it
def test_pipeline_stage_by_stage_on_nodes_that_share_no_disk(tmp_path, s3, machines):
    root = s3.uri("scaleforge")  # the storage root: the pipeline's output is {root}/pipeline
    out = storage.join(root, "pipeline")
    failed = _pipeline(tmp_path, "teacher", root, "--set", "fault.fail_at_stage=async_sgd")
    assert failed.returncode == 1
    _assert_console_is_ours(failed.stdout + failed.stderr)
    # Our own progress: a line per stage and per epoch (sent by the Ray Train workers through a queue).
    assert "[pipeline] 1/8 teacher: running" in failed.stdout and "[train] epoch 1/1" in failed.stdout
    assert (
        "error: stage async_sgd failed: injected failure" in failed.stderr
        and "--from async_sgd" in failed.stderr
    )
    records = storage.join(out, "records")
    assert sorted(storage.file_sizes(records)) == ["teacher.json"]
    teacher = json.loads(storage.read_text(storage.join(records, "teacher.json")))["artifact"]
    manifest = storage.join(out, "artifacts", "teacher", "manifest.json")
    manifest_before = storage.read_text(manifest)

    # The later stages in jobs on the cluster; each reuses what the earlier ones recorded. The first
    # (async SGD, compression, MoE, thresholds, Serve): its processes get the home and cache of the node
    # they run on (the replicas' caches are asserted below); the second gets a home of its own.
    served = _submit(machines, tmp_path, None, root, "--from", "async_sgd", "--to", "serve")
    assert "teacher: reused" in served and "async_sgd: running" in served and "compress: running" in served
    assert "moe: running" in served and "calibrate: running" in served
    assert "serve: left running for the next run (--from query)" in served
    assert "stopped after serve; continue with --from query" in served
    queried = _submit(machines, tmp_path, "query", root, "--from", "query")
    # jobs.serve of the serve config in the bucket, from a machine of its own, joined to the cluster: it
    # checks the config and its artifacts through its own cache, and the apps it deploys answer.
    cluster = {
        **_machine(tmp_path, "jobs-serve"),
        "RAY_ADDRESS": machines["gcs"],
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": machines["token"],
    }
    served_record = json.loads(storage.read_text(storage.join(records, "serve.json")))
    assert served_record["serve_config"] == storage.join(out, "serve.yaml")
    replicas = _serve_replicas(machines)
    _jobs_serve(
        served_record["serve_config"], cluster, while_serving=lambda: _serve_replicas(machines) == replicas
    )
    assert "serve: reused" in queried and "[query] cascade: requests" in queried
    assert storage.read_text(manifest) == manifest_before
    assert json.loads(storage.read_text(storage.join(records, "teacher.json")))["artifact"] == teacher

    table = queried[queried.index("served model") :]
    for name in ("teacher", "student", "cascade", "moe"):
        assert f"\n{name} " in table
    query = json.loads(storage.read_text(storage.join(records, "query.json")))
    assert set(query["models"]) == {"teacher", "student", "cascade", "moe"}
    assert all(row["accuracy"] > 0.2 for row in query["models"].values())  # 10 classes: chance is 0.1
    assert abs(sum(query["models"]["cascade"]["answered_per_stage"]) - 1) < 1e-6
    # Placement measured the cluster: the cheap stage on CPU-only nodes, the teacher on the GPU node.
    placement = query["placement"]
    assert (placement["cpu_nodes"], placement["gpu_nodes"]) == (2, 1)  # the head has no GPU either
    assert placement["models"]["student"] == "cpu" and placement["models"]["teacher"] == "gpu"
    # Each replica read its artifact from the bucket through its own node's cache.
    node_names = {node_id: name for name, node_id in machines["nodes"].items()}
    loaded = json.loads(storage.read_text(storage.join(records, "serve.json")))["loaded_from"]
    assert {"teacher", "student", "moe-gate", "moe-expert-0", "moe-expert-1"} <= set(loaded)
    where = {model: node_names[replica["node_id"]] for model, replica in loaded.items()}
    assert where["teacher"] == "gpu" and where["student"] == "cpu", where
    for model, replica in loaded.items():
        assert replica["artifact"].startswith(storage.join(out, "artifacts").partition("?")[0]), replica
        cache = machines["root"] / where[model] / "cache" / "artifacts"
        assert Path(replica["weights"]).parent.parent == cache, (model, replica)
    report = storage.file_sizes(storage.join(out, "report"))
    for name in (
        "report.md",
        "training_curves.png",
        "sync_vs_async.png",
        "compression_accuracy_vs_size.png",
        "cascade_accuracy_vs_cost.png",
    ):
        assert report.get(name, 0) > 0, name

    # The teacher the compression stage distilled came through a node's cache (its sha256 names the
    # folder); nothing was written locally but caches.
    sha = json.loads(storage.read_text(manifest))["weights"]["sha256"]
    assert list(machines["root"].glob(f"*/cache/artifacts/{sha}/model.safetensors"))
    kept = [
        p
        for root in (tmp_path, machines["root"])
        for p in root.rglob("*")
        if p.suffix in (".safetensors", ".json", ".pt", ".npz", ".png", ".yaml")
        and not {"cache", ".cache"} & set(p.relative_to(root).parts)
    ]
    assert kept == [], kept


def _serve_replicas(machines) -> set[str]:
    """The actor ids of the Serve replicas alive on the cluster (``ray list actors``)."""
    out = subprocess.run(
        [
            RAY,
            "list",
            "actors",
            "--address",
            machines["dashboard"],
            "--filter",
            "state=ALIVE",
            "--limit",
            "10000",
            "--format",
            "json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=machines["cli"],
    )
    assert out.returncode == 0, out.stderr
    return {
        actor["actor_id"]
        for actor in json.loads(out.stdout)
        if actor["class_name"].startswith("ServeReplica:")
    }


def _jobs_serve(config: str, env: dict[str, str], while_serving: Callable[[], bool]) -> None:
    """``python -m jobs.serve`` of the config the pipeline deployed, on the cluster that ``env`` joins:
    every app answers at the URL it prints, ``while_serving()`` holds then, and SIGTERM (``kill``, as
    a service manager stops it; Ctrl-C takes the same path) shuts Serve down and stops it quietly. A
    process started with SIGINT ignored, as a shell's background job is, stops on SIGTERM all the same."""
    began = time.monotonic()
    job = subprocess.Popen(
        [sys.executable, "-m", "jobs.serve", "--config", str(config)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        lines = []
        while not any(line.startswith("serving ") for line in lines):
            left = 420 - (time.monotonic() - began)
            assert left > 0 and job.poll() is None, "jobs.serve not serving within 420 s:\n" + "".join(lines)
            if select.select([job.stdout], [], [], left)[0]:
                lines.append(job.stdout.readline())
        print(f"jobs.serve serving after {time.monotonic() - began:.0f} s")
        url = re.search(r" at (http://\S+)/v2 ", lines[-1]).group(1)
        body = {"inputs": [{"name": "input", "shape": [2, 40], "datatype": "FP32", "data": [0.1] * 80}]}
        for model in ("teacher", "cascade", "moe"):
            answer = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=60)
            assert answer.status_code == 200, (model, answer.text)
        assert while_serving(), "jobs.serve of the config Serve runs restarted its replicas"
        # Serve shut down on the cluster (every app's replicas on three nodes, its proxies and
        # controller), quietly. It has taken over 60 s with the suite's other worker beside it.
        job.send_signal(signal.SIGTERM)
        try:
            rest, _ = job.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            job.kill()
            raise AssertionError(
                "jobs.serve still running 180 s after SIGTERM:\n" + "".join(lines) + job.communicate()[0]
            ) from None
        assert job.returncode == 0 and "stopping: shutting Serve down on the cluster" in rest, rest
        _assert_console_is_ours("".join(lines) + rest)
    finally:
        if job.poll() is None:
            job.kill()
