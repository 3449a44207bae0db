"""Hardware-aware placement: hwbench's measurements decide which nodes serve which models. (On a
cluster with a CPU node and a GPU node, with replicas reading the bucket through their node's
cache: ``tests/jobs/test_pipeline.py``.)"""

import json
import threading
from pathlib import Path

import pytest

from scaleforge.artifacts import save_artifact
from scaleforge.config.serve import ServeArgs
from scaleforge.deployment.hardware import DeviceReport, read_reports, write_reports
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
    # Models the config runs inside the ingress leave it for deployments on their nodes (the ingress runs
    # anywhere); the placed args stay valid (in_ingress with num_gpus would be refused).
    inside = app_args.model_copy(
        update={"models": [m.model_copy(update={"in_ingress": m.name != "gate"}) for m in app_args.models]}
    )
    placed, where = place_models(inside, hardware, gpu_share=0.25, gpu_min_parameters=10_000)
    models = {m.name: m for m in ServeArgs.model_validate(placed.model_dump()).models}
    assert where == {"student": "cpu", "teacher": "gpu", "gate": "any", "helper": "any"}
    assert (
        not models["student"].in_ingress and not models["teacher"].in_ingress and models["helper"].in_ingress
    )
    assert models["teacher"].num_gpus == 0.25


def test_a_cluster_of_one_kind_keeps_rays_default_placement(app_args):
    placed, where = place_models(app_args, ClusterHardware.from_reports([_report("a"), _report("b")]))
    assert placed is app_args and set(where.values()) == {"any"}
    with pytest.raises(ValueError, match="has no node_id: re-run jobs.hwbench"):
        ClusterHardware.from_reports([DeviceReport("host", "cpu", "x", 1)])


def test_placement_reads_hwbench_figures_from_a_path_a_file_uri_or_a_bucket(s3, tmp_path):
    reports = [_report("a"), _report("b", "cuda:0", 1.0)]
    for location in (str(tmp_path / "hw.json"), f"file://{tmp_path}/f/hw.json", s3.uri("placement/hw.json")):
        write_reports(reports, location)
        assert read_reports(location) == reports
        assert ClusterHardware.from_reports(read_reports(location)) == ClusterHardware(("a",), ("b",))


@pytest.mark.parametrize("scheme", ["path", "file://"])
def test_a_reader_never_sees_half_of_an_hwbench_file_being_rewritten(tmp_path, scheme):
    """Placement (another process) may read while jobs.hwbench rewrites the file: old or new, never half."""
    path = tmp_path / "hw.json"
    location = str(path) if scheme == "path" else f"file://{path}"
    small, large = [_report("a")], [_report(f"node-{i}", node_gpus=float(i % 2)) for i in range(400)]
    write_reports(small, location)
    seen, done = [], threading.Event()

    def read_while_written():
        while not done.is_set():
            try:
                seen.append(len(json.loads(path.read_text())))
            except json.JSONDecodeError:  # a half-written (or emptied) file
                seen.append("half")

    reader = threading.Thread(target=read_while_written)
    reader.start()
    try:
        for index in range(60):
            write_reports(large if index % 2 == 0 else small, location)
    finally:
        done.set()
        reader.join()
    assert set(seen) <= {1, 400} and len(seen) > 0
    assert [p.name for p in tmp_path.iterdir()] == ["hw.json"]  # no staging file left behind
