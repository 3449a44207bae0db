"""The nodes of bench/node_loss.py's cluster: the one running an actor, removed once a drill is ready."""

import threading
import time

import ray
from ray.cluster_utils import Cluster


def node_of(class_name: str, cluster: Cluster, deadline_s: float = 120):
    """The cluster node (a ``ray._private.node.Node``) running an alive actor of ``class_name``."""
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        # Straight from the GCS: the state API needs the dashboard, which may still be starting.
        alive = ray._private.state.actors(actor_state_name="ALIVE").values()
        by_id = {node.node_id: node for node in cluster.list_all_nodes()}
        for actor in alive:
            node_id = actor["Address"]["NodeID"]
            if (
                actor["ActorClassName"] == class_name
                and by_id.get(node_id, cluster.head_node) is not cluster.head_node
            ):
                return by_id[node_id]
        time.sleep(0.5)
    raise TimeoutError(f"no alive {class_name} on a worker node within {deadline_s:.0f} s")


def remove_later(cluster: Cluster, pick_node, removed: dict) -> threading.Thread:
    """In the background: wait for ``pick_node()``, then remove that node."""

    def run():
        node = pick_node()
        removed["node_id"], removed["at"] = node.node_id, time.time()
        cluster.remove_node(node, allow_graceful=False)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
