"""Hardware-aware placement on a cluster with a CPU-only node and a GPU node (one machine).

    python tests/cluster/placement_drill.py OUTPUT_DIR

Builds a ``ray.cluster_utils.Cluster`` (head without work, one CPU node, one node that declares a
GPU), measures it with ``measure_cluster`` (what ``jobs.hwbench`` runs), places a cascade's models
with ``place_models`` and serves them; prints one ``RESULT {...}`` line saying on which kind of
node each model's replica runs and what the cascade answered over HTTP. A GPU that is only
declared is enough for Ray's scheduling; the replica then runs its model on the CPU.
"""

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

    output = Path(sys.argv[1])
    data = load_mnist1d(4000, 42, 0.2, "~/.cache/scaleforge")
    student = fit_and_save(output / "student", MLPSpec(hidden=[32]), data, epochs=2)
    teacher = fit_and_save(output / "teacher", MLPSpec(hidden=[256, 256]), data, epochs=2)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cpu_node = cluster.add_node(num_cpus=2)
    gpu_node = cluster.add_node(num_cpus=2, num_gpus=1)
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
        body = {"inputs": [{"name": "input", "shape": [64, 40], "datatype": "FP32",
                            "data": data["x_test"][:64].ravel().tolist()}], "parameters": {"trace": True}}
        answer = httpx.post(f"http://127.0.0.1:{port}/v2/models/cascade/infer", json=body, timeout=60)
        stages = next(o["data"] for o in answer.json()["outputs"] if o["name"] == "stage")
        serve.shutdown()
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT", json.dumps({"cpu_nodes": len(hardware.cpu_nodes), "gpu_nodes": len(hardware.gpu_nodes),
                                "planned": where, "replicas": replicas, "status": answer.status_code,
                                "stages_used": sorted(set(stages))}), flush=True)


if __name__ == "__main__":
    main()
