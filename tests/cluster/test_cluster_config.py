"""cluster.yaml passes Ray's own launcher validation; broken copies are refused with the field named."""

import subprocess
import sys

import pytest
import yaml
from conftest import REPO

from scaleforge.cluster import ClusterConfigError, load_cluster_config, simulated_config

CLUSTER = REPO / "cluster.yaml"


def test_cluster_yaml_is_valid_and_declares_cpu_and_gpu_node_types():
    config = load_cluster_config(CLUSTER)
    types = config["available_node_types"]
    assert config["provider"]["type"] == "aws" and config["idle_timeout_minutes"] > 0
    assert any(t["resources"].get("GPU", 0) >= 1 for t in types.values())
    assert any(t["resources"].get("CPU", 0) > 0 and not t["resources"].get("GPU") for t in types.values())
    assert all(
        "min_workers" in t and "max_workers" in t for n, t in types.items() if n != config["head_node_type"]
    )
    assert "--dashboard-host=127.0.0.1" in " ".join(config["head_start_ray_commands"])


def _broken(tmp_path, edit):
    config = yaml.safe_load(CLUSTER.read_text())
    edit(config)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: c.update(max_workers="many"), "max_workers: 'many' is not of type 'integer'"),
        (
            lambda c: c.update(autoscale=True),
            "Additional properties are not allowed ('autoscale' was unexpected)",
        ),
        (
            lambda c: c["available_node_types"]["gpu_worker"].pop("node_config"),
            "available_node_types.gpu_worker: 'node_config' is a required property",
        ),
        (lambda c: c["available_node_types"]["gpu_worker"]["resources"].pop("GPU"), "g5.xlarge has GPUs"),
        (
            lambda c: c.update(head_start_ray_commands=["ray start --head --dashboard-host=0.0.0.0"]),
            "the dashboard must listen on 127.0.0.1",
        ),
    ],
)
def test_a_broken_copy_is_rejected_naming_the_field(tmp_path, edit, message):
    with pytest.raises(ClusterConfigError) as err:
        load_cluster_config(_broken(tmp_path, edit))
    assert message in str(err.value)


def test_the_cli_validates_and_exits_2_on_a_broken_copy(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "scaleforge.cluster", "validate", str(CLUSTER)], capture_output=True, text=True
    )
    assert ok.returncode == 0 and "valid" in ok.stdout, ok.stderr
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "scaleforge.cluster",
            "validate",
            str(_broken(tmp_path, lambda c: c.update(max_workers="many"))),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "error:" in bad.stderr and "Traceback" not in bad.stderr


def test_the_simulation_keeps_node_types_and_resources():
    config = load_cluster_config(CLUSTER)
    simulated = simulated_config(config, idle_timeout_minutes=0.1)
    assert simulated["provider"]["type"] == "fake_multinode" and simulated["idle_timeout_minutes"] == 0.1
    for name, node_type in config["available_node_types"].items():
        if name != config["head_node_type"]:
            assert simulated["available_node_types"][name]["resources"] == node_type["resources"]
