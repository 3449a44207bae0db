"""Clusters: ``cluster.yaml`` validation, a Ray head of its own, and a local autoscaling simulation."""

from scaleforge.cluster.config import ClusterConfigError, load_cluster_config, simulated_config
from scaleforge.cluster.local import LocalHead, free_ports

__all__ = ["ClusterConfigError", "LocalHead", "free_ports", "load_cluster_config", "simulated_config"]
