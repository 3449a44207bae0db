"""Artifacts on object storage, through a real S3 API server: written weights first and manifest last,
loaded through a node-local cache keyed by the weights' sha256, refused when incomplete or corrupted;
a URI is never taken for a local path, and unreachable storage fails in one line naming the URI."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import REPO

from scaleforge import storage
from scaleforge.artifacts import ArtifactError, load_artifact, read_manifest, save_artifact
from scaleforge.models import MLPSpec, build_model
from scaleforge.storage import StorageError


def _model(seed=0, hidden=(16,)):
    torch.manual_seed(seed)
    spec = MLPSpec(hidden=list(hidden))
    return spec, build_model(spec, 40, 10).eval()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """This test's node cache (``SCALEFORGE_CACHE``), empty."""
    folder = tmp_path / "node-cache"
    monkeypatch.setenv("SCALEFORGE_CACHE", str(folder))
    return folder / "artifacts"


def test_an_artifact_in_the_bucket_loads_through_the_node_cache_once(s3, cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec, model = _model()
    uri = s3.uri("artifacts/round-trip")
    assert (
        save_artifact(uri, model, spec, input_dim=40, num_classes=10, metrics={"test_accuracy": 0.5}) == uri
    )
    assert storage.is_file(storage.join(uri, "model.safetensors")) and storage.is_file(
        storage.join(uri, "manifest.json")
    )
    assert (
        list(tmp_path.iterdir()) == [tmp_path / "node-cache"] or list(tmp_path.iterdir()) == []
    )  # nothing local

    loaded = load_artifact(uri)
    x = torch.randn(5, 40)
    torch.testing.assert_close(loaded.model(x), model(x), rtol=0, atol=0)
    sha256 = read_manifest(uri)["weights"]["sha256"]
    assert loaded.path == uri and loaded.weights == cache / sha256 / "model.safetensors"
    first = loaded.weights.stat()

    again = load_artifact(uri)  # the cached copy, checked again, not downloaded again
    assert again.weights == loaded.weights and again.weights.stat().st_mtime_ns == first.st_mtime_ns
    assert sorted(p.name for p in cache.iterdir()) == [sha256, f"{sha256}.lock"]


def test_a_uri_is_never_taken_as_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec, model = _model()
    with pytest.raises(StorageError, match=r"^nosuch://bucket/a: this build cannot open nosuch:// storage"):
        save_artifact("nosuch://bucket/a", model, spec, input_dim=40, num_classes=10)
    with pytest.raises(StorageError, match="nosuch://"):
        load_artifact("nosuch://bucket/a")
    assert list(tmp_path.iterdir()) == []  # no folder named "nosuch:" appeared
    with pytest.raises(StorageError, match="a URI where a local path is needed"):
        storage.local_path("s3://bucket/a")


_WRITER = """
import sys, torch
from scaleforge.artifacts import save_artifact
from scaleforge.models import MLPSpec, build_model
spec = MLPSpec(hidden=[4096, 4096])  # about 70 MB of weights: an upload that takes a while
save_artifact(sys.argv[1], build_model(spec, 40, 10), spec, input_dim=40, num_classes=10)
"""


def test_a_writer_killed_mid_upload_leaves_an_artifact_that_is_refused_by_name(s3, cache):
    uri = s3.uri("artifacts/killed")
    spec, model = _model()
    save_artifact(uri, model, spec, input_dim=40, num_classes=10)  # the artifact being replaced
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, uri])
    try:
        deadline = time.monotonic() + 120
        while storage.is_file(storage.join(uri, "manifest.json")):  # gone: the new upload has begun
            assert writer.poll() is None and time.monotonic() < deadline, (
                "the writer never started its upload"
            )
            time.sleep(0.02)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == -signal.SIGKILL
    with pytest.raises(ArtifactError, match=r"s3://scaleforge-test/artifacts/killed: incomplete artifact"):
        load_artifact(uri)
    assert not cache.exists() or not any(cache.glob("*/model.safetensors"))


def test_a_corrupted_object_in_the_bucket_is_refused_by_its_checksum_and_never_cached(s3, cache):
    uri = s3.uri("artifacts/corrupted")
    spec, model = _model()
    save_artifact(uri, model, spec, input_dim=40, num_classes=10)
    weights = storage.join(uri, "model.safetensors")
    data = bytearray(storage.read_bytes(weights))
    data[-3] ^= 0x01
    storage.write_atomic(weights, bytes(data))
    with pytest.raises(
        ArtifactError, match=r"corrupted/model.safetensors: checksum mismatch .* refusing to load"
    ):
        load_artifact(uri)
    assert not any(cache.glob("*/model.safetensors"))


def test_unreachable_storage_and_a_missing_bucket_fail_in_one_line_naming_the_uri(s3):
    with pytest.raises(
        StorageError, match=r"^s3://no-such-bucket/x: bucket 'no-such-bucket' does not exist$"
    ):
        storage.check_reachable(s3.uri("x", bucket="no-such-bucket"))
    dead = "s3://scaleforge-test/x?endpoint_override=127.0.0.1:9&scheme=http"
    with pytest.raises(StorageError) as err:
        storage.check_reachable(dead)
    assert str(err.value).startswith("s3://scaleforge-test/x: storage not reachable (") and "\n" not in str(
        err.value
    )
    storage.check_reachable(s3.uri("x"))  # the bucket exists: passes


def test_a_training_job_given_a_missing_bucket_stops_before_ray_starts(s3, tmp_path):
    """The user's story: ``--set artifact.dir=s3://...`` used to create a local folder named ``s3:``.
    (A job that writes its artifact and checkpoints to the bucket:
    ``tests/distributed/test_dp_training.py``.)"""
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    env.pop("RAY_ADDRESS", None)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobs.train",
            "--config",
            "configs/train_dp.yaml",
            "--set",
            f"artifact.dir={s3.uri('a', bucket='no-such-bucket')}",
            "--set",
            f"run.storage_path={s3.uri('runs')}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert bad.stderr.strip().endswith(
        "artifact.dir: s3://no-such-bucket/a: bucket 'no-such-bucket' does not exist"
    )
    assert (
        not (tmp_path / "home").exists() and not (REPO / "s3:").exists()
    )  # Ray (which writes ~/.ray) never started
