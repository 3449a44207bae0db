"""Nodes that share no disk, on one machine: a ``ray.cluster_utils.Cluster`` whose every raylet has a
home, an artifact cache and a Ray temp folder of its own, as each machine of a real cluster has its
own disk.

A raylet and every worker it starts inherit the environment that the raylet was started in, so
``HOME`` and ``SCALEFORGE_CACHE`` are set for the moment a node starts. Ray's own files (the
session's runtime environments, spilled objects, logs) go to the node's own temp folder: with one
shared folder, a runtime environment that one node stops using is deleted under the processes of
another. Used by the multi-node tests and ``bench/node_loss.py``.
"""

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from scaleforge.cluster.local import free_ports

DISK_VARIABLES = ("HOME", "SCALEFORGE_CACHE")
"""What makes a node's disk its own: where ``~`` is, and where artifacts downloaded from storage are
cached."""


def disk_of(folder: Path) -> dict[str, str]:
    """The environment of a machine whose disk is ``folder``: ``folder/home`` and ``folder/cache``."""
    (folder / "home").mkdir(parents=True, exist_ok=True)
    return {"HOME": str(folder / "home"), "SCALEFORGE_CACHE": str(folder / "cache")}


@contextmanager
def own_disk(folder: Path) -> Iterator[dict[str, str]]:
    """While the block runs, processes started from here see ``folder`` as their machine's disk."""
    saved = {name: os.environ.get(name) for name in DISK_VARIABLES}
    disk = disk_of(folder)
    os.environ.update(disk)
    try:
        yield disk
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Machines:
    """A ``ray.cluster_utils.Cluster`` (``.cluster``) whose nodes share no disk; the first node added is
    the head. A context manager: leaving it shuts the cluster down and removes the nodes' Ray folders.

    Args:
        root: Each node's home and cache go under ``root/<name>``.
    """

    def __init__(self, root: Path):
        from ray._common.utils import get_default_ray_temp_dir
        from ray.cluster_utils import Cluster

        # Cluster.add_node also names the cluster in the machine's default Ray folder, which a machine
        # that never ran Ray has not created yet.
        os.makedirs(get_default_ray_temp_dir(), exist_ok=True)
        self.root, self.cluster = Path(root), Cluster()
        self._ray_folders: list[str] = []

    def add(self, name: str, **node_args):
        """Start node ``name`` with ``cluster.add_node(**node_args)``.

        Returns:
            The ``ray._private.node.Node`` (its ``node_id`` names it in Ray's state).
        """
        # Short, under /tmp: Ray's socket paths must fit in 107 bytes.
        folder = tempfile.mkdtemp(prefix="sfnode", dir="/tmp")
        self._ray_folders.append(folder)
        # Ports of its own for the node's agents, as on a machine of its own: Ray's defaults (the dashboard
        # agent's 52365) are one per machine, and a node whose agent lost the port to another node or
        # cluster has no agent, so a job submitted to a head in that state is refused ("No available agent").
        agent, metrics, export, runtime_env = free_ports(4)
        ports = {
            "dashboard_agent_listen_port": agent,
            "metrics_agent_port": metrics,
            "metrics_export_port": export,
            "runtime_env_agent_port": runtime_env,
        }
        with own_disk(self.root / name):
            node = self.cluster.add_node(temp_dir=folder, **{**ports, **node_args})
        # As `ray start` does: the node's folder names its cluster, which a job's driver joins ("auto");
        # without it Ray falls back to the machine's last started cluster, which may be another one.
        from ray._private.utils import write_ray_address

        write_ray_address(self.cluster.address, folder)
        return node

    def shutdown(self) -> None:
        self.cluster.shutdown()
        for folder in self._ray_folders:
            shutil.rmtree(folder, ignore_errors=True)

    def __enter__(self) -> "Machines":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
