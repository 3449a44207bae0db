"""``python -m jobs.calibrate``: thresholds fitted offline are written into the Serve config."""

import pytest
import yaml
from serving_env import serve_args, trained_models

import jobs.calibrate
from scaleforge.config import ServeConfig, load_config
from scaleforge.routers import CascadeEntry

pytestmark = pytest.mark.slow  # trains the session's small models unless the HTTP tests already did

HEADER = "# python -m jobs.serve --config serve.yaml\n# kept on rewrite\n"


def _serve_config(tmp_path, models):
    path = tmp_path / "serve.yaml"
    config = {
        "http_options": {"host": "127.0.0.1", "port": 8123},
        "applications": [{"name": "app", "args": serve_args(models, threshold=0.5)}],
    }
    path.write_text(HEADER + yaml.safe_dump(config, sort_keys=False))
    return path


def _calibrate_config(tmp_path, serve_path, **fields):
    path = tmp_path / "calibrate.yaml"
    path.write_text(
        "# python -m jobs.calibrate --config calibrate.yaml\n"
        + yaml.safe_dump({"serve_config": str(serve_path), **fields})
    )
    return path


def test_calibrate_writes_thresholds_that_meet_the_target(tmp_path_factory, tmp_path, capsys):
    models = trained_models(tmp_path_factory)
    serve_path = _serve_config(tmp_path, models)
    assert jobs.calibrate.main(["--config", str(_calibrate_config(tmp_path, serve_path))]) == 0
    report = capsys.readouterr().out
    assert "held-out (2000 inputs)" in report
    config = load_config(ServeConfig, serve_path)
    threshold = config.applications[0].args.routers_of(CascadeEntry)[0].stages[0].threshold
    assert 0.5 < threshold < 1.0
    assert serve_path.read_text().startswith(HEADER)
    accuracy, teacher = (float(v) for v in report.split("accuracy ")[1].split(" for")[0].split(" against "))
    assert accuracy >= teacher - 0.005


def test_escalation_budget_and_bad_config(tmp_path_factory, tmp_path, capsys):
    models = trained_models(tmp_path_factory)
    serve_path = _serve_config(tmp_path, models)
    out = tmp_path / "out.yaml"
    config = _calibrate_config(tmp_path, serve_path, target_escalation=0.25, output=str(out))
    assert jobs.calibrate.main(["--config", str(config)]) == 0
    assert "stage 1: 2" in capsys.readouterr().out  # about 25% handed on to the teacher
    assert (
        load_config(ServeConfig, out).applications[0].args.routers_of(CascadeEntry)[0].stages[0].threshold > 0
    )
    assert jobs.calibrate.main(["--config", str(config), "--set", "max_accuracy_loss=-1"]) == 2
    assert "max_accuracy_loss: Input should be greater than or equal to 0" in capsys.readouterr().err
