"""Artifacts: safetensors + manifest, atomic replacement, checksum-verified loading, no pickle."""

import json

import pytest
import torch
from safetensors.torch import load_file

from scaleforge.artifacts import ArtifactError, load_artifact, read_manifest, save_artifact
from scaleforge.models import CNN1dSpec, build_model


def _model(seed=0):
    torch.manual_seed(seed)
    spec = CNN1dSpec(channels=[4, 8], hidden=16)
    return spec, build_model(spec, 40, 10).eval()


def test_round_trip_predicts_identically(tmp_path):
    spec, model = _model()
    path = save_artifact(
        tmp_path / "a",
        model,
        spec,
        input_dim=40,
        num_classes=10,
        metrics={"test_accuracy": 0.5},
        dataset={"fingerprint": "sha256:abc"},
    )
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "model.safetensors"]
    loaded = load_artifact(path)
    x = torch.randn(7, 40)
    torch.testing.assert_close(loaded.model(x), model(x), rtol=0, atol=0)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["model"]["name"] == "cnn1d" and manifest["metrics"] == {"test_accuracy": 0.5}
    assert manifest["dataset"]["fingerprint"] == "sha256:abc"
    assert len(manifest["weights"]["sha256"]) == 64 and manifest["scaleforge_version"]
    assert set(load_file(path / "model.safetensors")) == set(model.state_dict())


def test_one_changed_byte_refuses_to_load(tmp_path):
    spec, model = _model()
    path = save_artifact(tmp_path / "a", model, spec, input_dim=40, num_classes=10)
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="checksum mismatch.*refusing to load"):
        load_artifact(path)


def test_failed_save_keeps_the_previous_artifact(tmp_path):
    spec, model = _model(0)
    path = save_artifact(tmp_path / "a", model, spec, input_dim=40, num_classes=10, metrics={"v": 1})
    _, other = _model(1)
    with pytest.raises(TypeError):
        save_artifact(tmp_path / "a", other, spec, input_dim=40, num_classes=10, metrics={"v": object()})
    assert read_manifest(path)["metrics"] == {"v": 1}
    torch.testing.assert_close(load_artifact(path).model(torch.ones(1, 40)), model(torch.ones(1, 40)))
    assert [p.name for p in tmp_path.iterdir()] == ["a"], "staging folders left behind"


def test_save_replaces_an_existing_artifact(tmp_path):
    spec, first = _model(0)
    _, second = _model(1)
    save_artifact(tmp_path / "a", first, spec, input_dim=40, num_classes=10)
    save_artifact(tmp_path / "a", second, spec, input_dim=40, num_classes=10)
    x = torch.randn(2, 40)
    torch.testing.assert_close(load_artifact(tmp_path / "a").model(x), second(x))
    assert [p.name for p in tmp_path.iterdir()] == ["a"]


def test_not_an_artifact(tmp_path):
    with pytest.raises(ArtifactError, match="not a model artifact"):
        load_artifact(tmp_path)
