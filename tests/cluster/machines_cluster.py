"""A cluster of nodes that share no disk, kept up while a test submits jobs to it.

    python tests/cluster/machines_cluster.py ROOT '{"head": {"num_cpus": 0}, "cpu": {"num_cpus": 3}, ...}'

A ``ray.cluster_utils.Cluster`` whose first node is the head (with the dashboard, for ``ray job
submit``), token authentication on, every node with a home and an artifact cache of its own
under ``ROOT/<name>``. Prints one ``READY {...}`` line (dashboard URL, token, each node's id), then
keeps the cluster up until its stdin closes.
"""

import json
import os
import secrets
import sys
from pathlib import Path


def main() -> None:
    token = secrets.token_hex(32)
    # Before Ray is imported (it reads them then); every process of the cluster inherits them.
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    from scaleforge.cluster import free_ports
    from scaleforge.cluster.local import wait_for_dashboard
    from scaleforge.cluster.machines import Machines

    root, spec = Path(sys.argv[1]), json.loads(sys.argv[2])
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    with Machines(root) as machines:
        nodes = {}
        for name, args in spec.items():
            dashboard = {"include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": port}
            head = {} if nodes else dashboard
            nodes[name] = machines.add(name, object_store_memory=300 << 20, **head, **args).node_id
        machines.cluster.wait_for_nodes()
        wait_for_dashboard(url, 120)
        print(
            "READY "
            + json.dumps({"dashboard": url, "gcs": machines.cluster.address, "token": token, "nodes": nodes}),
            flush=True,
        )
        sys.stdin.read()


if __name__ == "__main__":
    main()
