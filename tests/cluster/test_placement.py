"""Hardware-aware placement: hwbench's measurements decide which nodes serve which models. (On a
cluster with a CPU node and a GPU node, with replicas reading the bucket through their node's
cache: ``tests/jobs/test_pipeline.py``.)"""

from pathlib import Path

import pytest

from scaleforge.artifacts import save_artifact
from scaleforge.config.serve import ServeArgs
from scaleforge.deployment.hardware import DeviceReport
from scaleforge.deployment.placement import ClusterHardware, node_selector, place_models
from scaleforge.models import MLPSpec, build_model


def _report(node_id, device="cpu", node_gpus=0.0):
    return DeviceReport("host", device, "x", 1, node_id=node_id, node_gpus=node_gpus)


def _artifact(folder: Path, hidden: list[int]) -> str:
    spec = MLPSpec(hidden=hidden)
    return str(save_artifact(folder, build_model(spec, 40, 10), spec, input_dim=40, num_classes=10))


@pytest.fixture(scope="module")
def app_args(tmp_path_factory):
    root = tmp_path_factory.mktemp("placement")
    models = {"student": [4], "teacher": [512, 256], "gate": [8], "helper": [16]}
    return ServeArgs(
        models=[{"name": n, "artifact": _artifact(root / n, h)} for n, h in models.items()],
        routers=[
            {
                "kind": "cascade",
                "name": "c",
                "stages": [{"model": "student", "threshold": 0.9}, {"model": "teacher"}],
            }
        ],
    )


def test_a_mixed_cluster_puts_the_cheap_stage_on_cpu_nodes_and_large_models_on_gpu_nodes(app_args):
    # Node b has a GPU that hwbench measured, node c one that Ray lists; node a has none.
    hardware = ClusterHardware.from_reports(
        [_report("a"), _report("b"), _report("b", "cuda:0", 1.0), _report("c", node_gpus=1.0)]
    )
    assert hardware == ClusterHardware(("a",), ("b", "c"))
    placed, where = place_models(app_args, hardware, gpu_share=0.25, gpu_min_parameters=10_000)
    assert where == {"student": "cpu", "teacher": "gpu", "gate": "any", "helper": "any"}
    models = {m.name: m for m in placed.models}
    assert models["student"].label_selector == {"ray.io/node-id": "in(a)"} and models["student"].num_gpus == 0
    assert models["teacher"].label_selector == node_selector(["c", "b"]) == {"ray.io/node-id": "in(b,c)"}
    assert models["teacher"].num_gpus == 0.25
    assert models["gate"].label_selector is None and app_args.models[0].label_selector is None
    # A lower size bar makes more models large; the cheap first stage may never be one of them.
    _, where = place_models(app_args, hardware, gpu_min_parameters=400)
    assert where["gate"] == "gpu" and where["helper"] == "gpu"
    with pytest.raises(ValueError, match=r"\['student'\] are both a router's cheap model"):
        place_models(app_args, hardware, gpu_min_parameters=10)


def test_a_cluster_of_one_kind_keeps_rays_default_placement(app_args):
    placed, where = place_models(app_args, ClusterHardware.from_reports([_report("a"), _report("b")]))
    assert placed is app_args and set(where.values()) == {"any"}
    with pytest.raises(ValueError, match="has no node_id: re-run jobs.hwbench"):
        ClusterHardware.from_reports([DeviceReport("host", "cpu", "x", 1)])
