"""``python -m scaleforge.cluster validate cluster.yaml`` | ``simulate cluster.yaml`` |
``kuberay job|service|cluster ...``.

``simulate`` starts a head whose autoscaler launches ``cluster.yaml``'s node types as fake nodes
on this machine, prints how to reach it, and runs until interrupted. ``kuberay`` prints a KubeRay
manifest (``RayJob``, ``RayService``, ``RayCluster``) made from a job config, a serve config or
``cluster.yaml``, checked against the operator's schema and rules (``scaleforge.cluster.kuberay``).
"""

import argparse
import sys
import time

from scaleforge.cluster import ClusterConfigError, LocalHead, load_cluster_config, simulated_config
from scaleforge.config import ConfigError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaleforge.cluster", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("validate", "simulate"):
        command = commands.add_parser(name)
        command.add_argument("config", help="a Ray cluster-launcher YAML, e.g. cluster.yaml")
        if name == "simulate":
            command.add_argument(
                "--idle-timeout-minutes",
                type=float,
                help="remove idle nodes after this long (default: the config's)",
            )
            command.add_argument("--head-cpus", type=float, default=1, help="logical CPUs of the head")
    kuberay = commands.add_parser("kuberay", help="print a KubeRay manifest")
    kuberay.add_argument("kind", choices=["job", "service", "cluster"])
    kuberay.add_argument(
        "source", nargs="?", help="cluster: the cluster-launcher YAML (default cluster.yaml)"
    )
    kuberay.add_argument("--config", help="job: a job config; service: a serve config")
    kuberay.add_argument(
        "--image", required=True, help="a container image with the project installed at /app"
    )
    kuberay.add_argument(
        "--storage", help="job, service: the bucket every pod reads and writes (s3://B/prefix)"
    )
    kuberay.add_argument("--set", action="append", default=[], help="job: a config override KEY=VALUE")
    kuberay.add_argument(
        "--tpu",
        help="cluster: add a TPU worker group, ACCELERATOR:TOPOLOGY[:MAX_SLICES] (tpu-v5-lite-podslice:4x4)",
    )
    kuberay.add_argument("--out", help="write the manifest here rather than to stdout")
    args = parser.parse_args(argv)
    if args.command == "kuberay":
        return _kuberay(args, parser)
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


def _kuberay(args, parser) -> int:
    from scaleforge.cluster import kuberay

    if args.kind != "cluster" and not (args.config and args.storage):
        parser.error(f"kuberay {args.kind} needs --config and --storage")
    try:
        if args.kind == "job":
            manifest = kuberay.job_manifest(args.config, args.image, args.storage, tuple(args.set))
        elif args.kind == "service":
            manifest = kuberay.service_manifest(args.config, args.image, args.storage)
        else:
            manifest = kuberay.cluster_manifest(args.source or "cluster.yaml", args.image, args.tpu)
    except (kuberay.ManifestError, ConfigError, ClusterConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = kuberay.dump(manifest, args.out)
    if not args.out:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
