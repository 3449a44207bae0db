"""Hardware-aware placement on a cluster with a CPU-only node and a GPU node (one machine).

    python tests/cluster/placement_drill.py OUTPUT_DIR ARTIFACTS_URI

Builds a ``ray.cluster_utils.Cluster`` (head without work, one CPU node, one node that declares a
GPU), measures it with ``measure_cluster`` (what ``jobs.hwbench`` runs), places a cascade's models
with ``place_models`` and serves them; prints one ``RESULT {...}`` line saying on which kind of
node each model's replica runs, which node cache it read its weights from, and what the cascade
answered over HTTP. A GPU that is only declared is enough for Ray's scheduling; the replica then
runs its model on the CPU.

The nodes share no artifact folder: the models are written to ``ARTIFACTS_URI`` (a bucket), and
each node has a cache of its own (``SCALEFORGE_CACHE``, which a raylet and its workers inherit
from the environment it starts in, as each machine of a real cluster has its own disk).
"""

import os

import json
import sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "platform"), str(REPO)]


def main() -> None:
    import httpx
    from ray import serve

    from scaleforge.cluster import free_ports
    from scaleforge.config.serve import ServeArgs
    from scaleforge.data import load_mnist1d
    from scaleforge.hardware import measure_cluster
    from scaleforge.models import MLPSpec
    from scaleforge.placement import ClusterHardware, place_models
    from scaleforge.quickfit import fit_and_save
    from serving.app import build_app

    from scaleforge.storage import join

    output, bucket = Path(sys.argv[1]), sys.argv[2]
    data = load_mnist1d(4000, 42, 0.2, "~/.cache/scaleforge")
    student = fit_and_save(join(bucket, "student"), MLPSpec(hidden=[32]), data, epochs=2)
    teacher = fit_and_save(join(bucket, "teacher"), MLPSpec(hidden=[256, 256]), data, epochs=2)
    caches = {kind: output / f"cache-{kind}" for kind in ("head", "cpu", "gpu")}
    os.environ["SCALEFORGE_CACHE"] = str(caches["head"])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    os.environ["SCALEFORGE_CACHE"] = str(caches["cpu"])
    cpu_node = cluster.add_node(num_cpus=2)
    os.environ["SCALEFORGE_CACHE"] = str(caches["gpu"])
    gpu_node = cluster.add_node(num_cpus=2, num_gpus=1)
    os.environ["SCALEFORGE_CACHE"] = str(caches["head"])
    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        hardware = ClusterHardware.from_reports(measure_cluster(cpu_size=128, gpu_size=128, repeats=1))
        args = ServeArgs.model_validate(
            {"models": [{"name": "student", "artifact": str(student), "num_cpus": 0.5},
                        {"name": "teacher", "artifact": str(teacher), "num_cpus": 0.5}],
             "cascades": [{"name": "cascade", "stages": [{"model": "student", "threshold": 0.9}, {"model": "teacher"}]}],
             "ingress": {"num_cpus": 0.25}})
        args, where = place_models(args, hardware, gpu_share=0.5)
        (port,) = free_ports(1)
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        serve.run(build_app(args), name="placed", route_prefix="/")
        kinds = {cpu_node.node_id: "cpu", gpu_node.node_id: "gpu"}
        replicas = {}
        for actor in ray._private.state.actors(actor_state_name="ALIVE").values():
            name = actor["ActorClassName"]
            if name.startswith("ServeReplica:placed:model-"):
                replicas[name.removeprefix("ServeReplica:placed:model-")] = kinds.get(actor["Address"]["NodeID"], "head")
        cache_of = {str(folder): kind for kind, folder in caches.items()}
        read_from = {}
        for model in ("student", "teacher"):
            handle = serve.get_deployment_handle(f"model-{model}", app_name="placed")
            loaded = handle.loaded_from.remote().result(timeout_s=60)
            weights = Path(loaded["weights"])
            read_from[model] = {"node": kinds.get(loaded["node_id"], "head"), "artifact": loaded["artifact"],
                                "cache": cache_of.get(str(weights.parents[2]), str(weights))}
        body = {"inputs": [{"name": "input", "shape": [64, 40], "datatype": "FP32",
                            "data": data["x_test"][:64].ravel().tolist()}], "parameters": {"trace": True}}
        answer = httpx.post(f"http://127.0.0.1:{port}/v2/models/cascade/infer", json=body, timeout=60)
        stages = next(o["data"] for o in answer.json()["outputs"] if o["name"] == "stage")
        serve.shutdown()
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT", json.dumps({"cpu_nodes": len(hardware.cpu_nodes), "gpu_nodes": len(hardware.gpu_nodes),
                                "planned": where, "replicas": replicas, "read_from": read_from,
                                "local_artifacts": sorted(str(p) for p in output.rglob("manifest.json")),
                                "status": answer.status_code,
                                "stages_used": sorted(set(stages))}), flush=True)


if __name__ == "__main__":
    main()
