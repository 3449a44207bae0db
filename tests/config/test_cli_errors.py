"""Bad input through the real command line: one line on stderr, exit 2, and no Ray cluster started."""

import importlib
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

from scaleforge.config.cli import import_object, resolve

CASES = {
    "optim.batch_size=0": "optim.batch_size: Input should be greater than 0",
    "optim.lr=-1": "optim.lr: Input should be greater than 0",
    "scaling.num_workers=100000": (
        "scaling.num_workers (100000) is larger than the number of training examples"
    ),
    "model.name=nosuchnet": "model.name: unknown name 'nosuchnet'",
    "data.source=/nonexistent/data.parquet": (
        "data.source: data file '/nonexistent/data.parquet' does not exist"
    ),
    "optim.bogus=1": "optim.bogus: unknown key",
}


def test_cli_rejects_bad_configs_before_ray_starts(tmp_path):
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "RAY_ADDRESS": ""}
    procs = {
        override: subprocess.Popen(
            [sys.executable, "-m", "jobs.train", "--config", "configs/train_dp.yaml", "--set", override],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for override in CASES
    }
    for override, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 2, (override, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("error: configs/train_dp.yaml"), lines[0]
        assert CASES[override] in lines[0]
        assert "Traceback" not in err and out == ""
    assert list(ray_tmp.iterdir()) == [], "a Ray session was created for an invalid config"


def test_missing_config_file_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.train", "--config", str(tmp_path / "none.yaml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'none.yaml'}: config file not found"


PREFLIGHT_CASES = {
    (
        "jobs.pipeline",
        "configs/pipeline.yaml",
        "teacher.set=[scaling.num_workers=100000]",
    ): "stage teacher: configs/train_teacher.yaml (with --set scaling.num_workers=100000): "
    "scaling.num_workers (100000) is larger than the number of training examples (16000)",
    (
        "jobs.pipeline",
        "configs/pipeline.yaml",
        "compress.config=configs/nothere.yaml",
    ): "compress.config: 'configs/nothere.yaml' does not exist",
    (
        "jobs.pipeline",
        "configs/pipeline.yaml",
        "placement.hwbench=/nonexistent/hw.json",
    ): "placement.hwbench: '/nonexistent/hw.json' does not exist (run python -m jobs.hwbench)",
    (
        "jobs.calibrate",
        "configs/calibrate.yaml",
        "serve_config=/nonexistent/serve.yaml",
    ): "serve_config: '/nonexistent/serve.yaml' does not exist",
    (
        "jobs.async_sgd",
        "configs/async_sgd.yaml",
        "data.source=/nonexistent/data.npz",
    ): "data.source: data file '/nonexistent/data.npz' does not exist",
}


@pytest.mark.parametrize(
    "job,config,override", list(PREFLIGHT_CASES), ids=[" ".join(c[::2]) for c in PREFLIGHT_CASES]
)
def test_preflight_failures_are_one_line_naming_file_and_field(job, config, override, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # the stage configs are named relative to the repository
    code = importlib.import_module(job).main(["--config", config, "--set", override])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == f"error: {config} (with --set {override}): {PREFLIGHT_CASES[job, config, override]}\n"


@pytest.mark.parametrize(
    "path, named",
    [
        ("scaleforge.config.cli:no_such_name", "module 'scaleforge.config.cli' has no 'no_such_name'"),
        ("scaleforge.config.cli.no_such_name", "module 'scaleforge.config.cli' has no 'no_such_name'"),
        ("no_such_module:run", "No module named 'no_such_module'"),
    ],
)
def test_a_job_or_app_path_that_does_not_import_names_what_is_missing(path, named):
    assert resolve("scaleforge.config.cli:import_object") is import_object
    assert import_object("scaleforge.config.cli.resolve") is resolve
    with pytest.raises(ImportError, match=named):
        import_object(path)


_HEAVY = ("ray.train", "ray.data", "ray.serve", "matplotlib", "torch.distributed.tensor")

_IMPORT_EACH = r"""
import importlib, json, sys
heavy, pulled = tuple(sys.argv[1].split(",")), {}
for module in sys.argv[2:]:
    importlib.import_module(module)
    pulled[module] = sorted(n for n in sys.modules if n in heavy and n not in sum(pulled.values(), []))
print(json.dumps(pulled))
"""


def test_preflights_import_none_of_rays_libraries():
    """A config that cannot run is refused in seconds: the pre-flights that the jobs name import neither Ray
    Train, Ray Data nor Ray Serve (Ray Train's import alone is 4 s of CPU here), nor matplotlib or torch's
    DTensor (0.8 s). Except jobs.serve's: it checks the config with Serve's own schema."""
    sources = "".join(path.read_text() for path in sorted((REPO / "jobs").glob("*.py")))
    modules = sorted(set(re.findall(r'preflight="([\w.]+):\w+"', sources)) - {"scaleforge.deployment.deploy"})
    assert {
        "scaleforge.train.preflight",
        "scaleforge.train.plan",
        "scaleforge.compress.preflight",
        "scaleforge.paramserver.preflight",
    } <= set(modules), modules
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, ",".join(_HEAVY), *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {module: [] for module in modules}
