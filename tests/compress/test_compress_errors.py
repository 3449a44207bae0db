"""A recipe that cannot run fails with one clear line and exit status 2.

The error comes before Ray starts or anything is written.
"""

import json
from pathlib import Path

import pytest
import yaml
from compress_helpers import TINY_TEACHER

from jobs.compress import main
from scaleforge.artifacts import save_artifact
from scaleforge.config import CompressJobConfig, load_config
from scaleforge.models import build_model

RECIPE = [
    {"step": "prune", "method": "structured", "sparsity": 0.5},
    {"step": "low_rank", "layers": ["head.1"], "rank": 16},
    {"step": "quantize"},
]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """An (untrained) artifact with the tiny teacher's architecture: validation only reads its shape."""
    return save_artifact(
        tmp_path_factory.mktemp("teacher") / "artifact",
        build_model(TINY_TEACHER, 40, 10),
        TINY_TEACHER,
        input_dim=40,
        num_classes=10,
    )


def _run(tmp_path: Path, teacher: Path, recipe: list, capsys, *overrides: str):
    config = tmp_path / "compress.yaml"
    config.write_text(
        yaml.safe_dump({"teacher": str(teacher), "recipe": recipe, "output": str(tmp_path / "out")})
    )
    code = main(["--config", str(config), *[arg for item in overrides for arg in ("--set", item)]])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "recipe, message",
    [
        (
            [{"step": "sharpen"}],
            "recipe.0.step: unknown name 'sharpen'; "
            "choose one of 'distill', 'prune', 'low_rank', 'quantize', 'export'",
        ),
        (
            [{"step": "prune", "sparsity": 0.5, "layers": ["head.9"]}],
            "recipe[0] (prune): unknown layer 'head.9'; "
            "layers: features.0, features.3, features.7, head.1, head.4",
        ),
        ([{"step": "prune", "sparsity": 1.0}], "recipe.0.prune.sparsity: Input should be less than 1"),
        (
            [{"step": "prune", "sparsity": -0.1}],
            "recipe.0.prune.sparsity: Input should be greater than or equal to 0",
        ),
        (
            [{"step": "low_rank", "layers": ["head.1"], "rank": 129}],
            "recipe[0] (low_rank): rank 129 is larger than layer 'head.1' allows (128 x 640: at most 128)",
        ),
        # after structured pruning to half width, head.1 is 64 x 320: rank 100 no longer fits
        (
            [RECIPE[0], {"step": "low_rank", "layers": ["head.1"], "rank": 100}],
            "recipe[1] (low_rank): rank 100 is larger than layer 'head.1' allows (64 x 320: at most 64)",
        ),
        (
            [{"step": "low_rank", "layers": ["features.3"], "rank": 4}],
            "recipe[0] (low_rank): unknown layer 'features.3'",
        ),
        (
            [{"step": "quantize"}, {"step": "prune", "sparsity": 0.5}],
            "recipe[1] (prune): the model is already quantized; only export can follow quantize",
        ),
        (
            [{"step": "quantize"}, {"step": "export", "onnx": True}],
            "onnx export takes fp32 or half-precision models",
        ),
    ],
)
def test_bad_recipes_fail_before_any_work(tmp_path, teacher, capsys, recipe, message):
    code, err = _run(tmp_path, teacher, recipe, capsys)
    assert code == 2
    assert message in err, err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_teacher_with_a_bad_checksum_is_refused_and_nothing_is_written(tmp_path, teacher, capsys):
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for item in teacher.iterdir():
        (tampered / item.name).write_bytes(item.read_bytes())
    weights = bytearray((tampered / "model.safetensors").read_bytes())
    weights[-1] ^= 0xFF
    (tampered / "model.safetensors").write_bytes(bytes(weights))
    code, err = _run(tmp_path, tampered, RECIPE, capsys)
    assert code == 2
    assert "teacher: " in err and "checksum mismatch" in err and "refusing to load" in err
    assert not (tmp_path / "out").exists()


def test_a_missing_teacher_and_a_bad_override_are_named(tmp_path, teacher, capsys):
    code, err = _run(tmp_path, tmp_path / "nowhere", RECIPE, capsys)
    assert code == 2 and "teacher: artifact folder" in err and "does not exist" in err
    code, err = _run(tmp_path, teacher, RECIPE, capsys, "measure.threads=0")
    assert (
        code == 2 and "(with --set measure.threads=0): measure.threads: Input should be greater than 0" in err
    )
    assert not (tmp_path / "out").exists()


def test_the_shipped_config_names_the_default_teacher():
    config = yaml.safe_load(Path("configs/compress.yaml").read_text())
    assert (config["storage"], config["teacher"]) == ("~/scaleforge", "artifacts/teacher")
    assert load_config(CompressJobConfig, "configs/compress.yaml").teacher == "~/scaleforge/artifacts/teacher"
    assert [step["step"] for step in config["recipe"]] == ["distill", "prune", "quantize", "export"]
    assert json.dumps(config)  # plain YAML, no tags
