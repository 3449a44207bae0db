"""``python -m scaleforge.cluster validate cluster.yaml`` | ``simulate cluster.yaml``.

``simulate`` starts a head whose autoscaler launches ``cluster.yaml``'s node types as fake nodes
on this machine, prints how to reach it, and runs until interrupted.
"""

import argparse
import sys
import time

from scaleforge.cluster import ClusterConfigError, LocalHead, load_cluster_config, simulated_config


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaleforge.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["validate", "simulate"])
    parser.add_argument("config", help="a Ray cluster-launcher YAML, e.g. cluster.yaml")
    parser.add_argument(
        "--idle-timeout-minutes",
        type=float,
        default=None,
        help="simulate: remove idle nodes after this long (default: the config's)",
    )
    parser.add_argument("--head-cpus", type=float, default=1, help="simulate: logical CPUs of the head")
    args = parser.parse_args(argv)
    try:
        config = load_cluster_config(args.config)
    except ClusterConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    types = ", ".join(
        f"{name} {spec.get('resources')}" for name, spec in config["available_node_types"].items()
    )
    print(f"{args.config}: valid ({types})")
    if args.command == "validate":
        return 0
    simulated = simulated_config(config, idle_timeout_minutes=args.idle_timeout_minutes)
    with LocalHead(args.head_cpus, autoscaling_config=simulated) as head:
        print(
            f"simulated cluster up: RAY_ADDRESS={head.gcs_address} RAY_AUTH_MODE=token "
            f"RAY_AUTH_TOKEN={head.token}\ndashboard {head.dashboard_url}; Ctrl-C stops it",
            flush=True,
        )
        try:
            while head.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
