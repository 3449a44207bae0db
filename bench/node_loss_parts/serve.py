"""The Serve drill of bench/node_loss.py: a replica's node lost under load from the library's load
generator."""

import math
import threading
import time

from ray.cluster_utils import Cluster

from node_loss_parts.nodes import node_of
from scaleforge import storage


def serve_app(cluster: Cluster, output: str) -> dict:
    """A Serve app with its replicas on two nodes, under load from 4 clients; one node goes away."""
    from ray import serve

    from scaleforge.cluster import free_ports
    from scaleforge.data import load_mnist1d
    from scaleforge.models import MLPSpec
    from scaleforge.pipeline.load import closed_loop, infer_request
    from scaleforge.quickfit import fit_and_save
    from serving.app import build_app

    data = load_mnist1d(4000, 42, 0.2, "~/.cache/scaleforge")
    artifact = fit_and_save(storage.join(output, "model"), MLPSpec(hidden=[64]), data, epochs=3)
    spread = {"replicas": 2, "max_replicas_per_node": 1, "num_cpus": 0.5}
    (port,) = free_ports(1)
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    serve.run(
        build_app({"models": [{"name": "m", "artifact": str(artifact), **spread}], "ingress": spread}),
        name="drill",
        route_prefix="/",
    )
    request = infer_request("/v2/models/m/infer", data["x_test"][:16], {})
    stop, loads = threading.Event(), []
    # The library's load generator: 4 clients until stopped; a request with no HTTP answer at all
    # (within 30 s) is an answer of status 0.
    clients = threading.Thread(
        target=lambda: loads.append(
            closed_loop(
                [f"http://127.0.0.1:{port}"],
                [request],
                lambda ticket, response: None,
                4,
                math.inf,
                attempts=1,
                timeout_s=30,
                record_errors=True,
                stop=stop,
            )
        )
    )
    clients.start()
    time.sleep(3)
    node = node_of("ServeReplica:drill:model-m", cluster)
    removed_at = time.time()
    cluster.remove_node(node, allow_graceful=False)
    time.sleep(15)
    stop.set()
    clients.join()
    statuses = [(answer.at, answer.status) for answer in loads[0].answers]
    settled = removed_at + 10  # the loss detected (health checks) and routing updated
    after = [code for at, code in statuses if at > settled]
    failed = [(at, code) for at, code in statuses if code != 200]
    serve.shutdown()
    return {
        "requests": len(statuses),
        "failed": len(failed),
        "failed_codes": sorted({c for _, c in failed}),
        "failed_before_loss": sum(at < removed_at for at, _ in failed),
        "answered_after_loss": sum(code == 200 for code in after),
        "after_loss": len(after),
        "removed": node.node_id,
    }
