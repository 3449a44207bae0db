"""Building a config is pure: no file read but its YAML, no torch imported (the pre-flights do the rest)."""

import json
import os
import subprocess
import sys

from conftest import REPO
from test_configs import CONFIGS, job_of

# Runs in a fresh interpreter: torch cannot be imported, and once the imports are done every
# open() except the YAML being loaded raises, so a schema that reads a file fails loudly.
_BUILD_EVERY_CONFIG = r"""
import importlib.abc, json, os, sys


class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError(f"building a config imported {name}")
        return None


sys.meta_path.insert(0, _NoTorch())
from scaleforge.config import JOB_SCHEMAS, load_config

configs = json.loads(sys.argv[1])
allowed = {"path": None}


def _only_the_yaml(event, args):
    if event == "open" and os.path.abspath(os.fsdecode(args[0])) != allowed["path"]:
        raise PermissionError(f"building a config opened {args[0]!r}")


sys.addaudithook(_only_the_yaml)
built = {}
for path, job in configs:
    allowed["path"] = os.path.abspath(path)
    try:
        built[os.path.basename(path)] = type(load_config(JOB_SCHEMAS[job], path)).__name__
    except Exception as err:
        built[os.path.basename(path)] = f"{type(err).__name__}: {err}"
allowed["path"] = None
torch = sorted(name for name in sys.modules if name.split(".")[0] == "torch")
guards = []  # both guards are live: a file read and a torch import would have failed
for attempt in (lambda: open(os.devnull).close(), lambda: __import__("torch")):
    try:
        attempt()
    except (PermissionError, ImportError) as err:
        guards.append(type(err).__name__)
sys.stdout.write(json.dumps({"built": built, "torch": torch, "guards": guards}))
"""


def test_every_config_builds_without_torch_or_file_reads():
    configs = [(str(path), job_of(path)) for path in CONFIGS]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _BUILD_EVERY_CONFIG, json.dumps(configs)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    from scaleforge.config import JOB_SCHEMAS

    # A schema whose ``kind`` picks a subclass (the main job's) builds that subclass.
    kinds = {
        job: {s.__name__ for s in (schema, *schema.__subclasses__())} for job, schema in JOB_SCHEMAS.items()
    }
    built = result["built"]
    assert all(built[os.path.basename(path)] in kinds[job] for path, job in configs), built
    assert result["torch"] == []
    assert result["guards"] == ["PermissionError", "ImportError"]
