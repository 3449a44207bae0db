"""Node-loss drills: a node removed mid-run on a multi-node cluster on one machine
(``ray.cluster_utils.Cluster``: a head that holds no work and three 2-CPU raylets).

    .venv/bin/python bench/node_loss.py      (about 4 minutes on 2 idle cores)

One after another on one cluster (a fresh node replaces the one the previous drill removed):

- ``configs/async_sgd.yaml`` on 8,000 samples: the node holding a parameter shard goes away once
  the run has checkpointed; the shards restart on surviving nodes from their checkpoints;
- ``configs/train_dp.yaml``: a Ray Train worker's node goes away once the first checkpoint is
  registered; the job resumes from it on the surviving nodes;
- a Serve app with its replicas on two nodes (``max_replicas_per_node: 1``) under load from 4
  clients: one of them goes away.

Prints what each lost and how it ended, beside its bar (met/missed); exit status 1 if one is missed.
The suite covers each failure within a node (a killed worker, shard, replica); this is the
multi-node version, which takes minutes of cluster time.

The nodes share no disk, as on a cloud cluster: every checkpoint, artifact and record goes to a bucket
of a real S3 server (moto's, started on 127.0.0.1, see ``scaleforge.storage.local_s3``), each node has
an artifact cache of its own, and a restarted shard or training run resumes from the bucket.
"""

import itertools
import json
import sys
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "platform"), str(REPO)]

from bars import print_bars  # noqa: E402
from node_loss_parts.nodes import node_of, remove_later  # noqa: E402
from node_loss_parts.serve import serve_app  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge import storage  # noqa: E402
from scaleforge.cluster.machines import Machines  # noqa: E402
from scaleforge.config import AsyncSGDConfig, TrainJobConfig, load_config  # noqa: E402
from scaleforge.storage.local_s3 import LocalS3  # noqa: E402


def async_sgd(cluster: Cluster, output: str) -> dict:
    """Remove the node holding shard 0 once the run has checkpointed a few times."""
    from scaleforge.paramserver import run_async_sgd

    cfg = load_config(
        AsyncSGDConfig,
        REPO / "configs/async_sgd.yaml",
        [
            "data.num_samples=8000",
            "workers.epochs=12",
            "server.checkpoint_every=25",
            "run.eval_every_s=1",
            f"run.output_dir={storage.join(output, 'out')}",
            f"artifact.dir={storage.join(output, 'artifact')}",
        ],
    )
    removed: dict = {}

    def shard_node_after_a_while():
        node = node_of("ParameterShard", cluster)
        time.sleep(6)  # some checkpoints written, some updates since
        return node

    remove_later(cluster, shard_node_after_a_while, removed)
    result = run_async_sgd(cfg)
    shards = storage.file_sizes(storage.join(output, "out", "checkpoints"))
    return {
        "test_accuracy": result.test_accuracy,
        "events": result.events,
        "removed": removed.get("node_id"),
        "checkpoint_every": cfg.server.checkpoint_every,
        "updates": result.updates,
        "in_bucket": sorted(shards) == [f"shard{i}.safetensors" for i in range(cfg.server.num_shards)],
    }


def _registered_checkpoints(snapshot: str) -> list:
    try:
        return json.loads(storage.read_text(snapshot)).get("checkpoint_results", [])
    except (OSError, ValueError):  # not written yet
        return []


def train(cluster: Cluster, output: str) -> dict:
    """Remove a training worker's node once the first checkpoint is registered; the surviving nodes have
    room (the surviving worker fails at its next collective, and the controller restarts the group)."""
    from scaleforge.train import run_training

    cfg = load_config(
        TrainJobConfig,
        REPO / "configs/train_dp.yaml",
        [
            "data.num_samples=20000",
            "optim.epochs=5",
            "run.max_failures=2",
            f"run.storage_path={storage.join(output, 'runs')}",
            "run.name=node-loss",
            f"artifact.dir={storage.join(output, 'artifact')}",
        ],
    )
    removed: dict = {}

    def worker_node_after_a_checkpoint():
        # Registered by Ray Train's controller, not merely written: a checkpoint folder appears
        # before the controller has recorded it, and a loss then restarts the run from scratch.
        snapshot = storage.join(output, "runs", "node-loss", "checkpoint_manager_snapshot.json")
        while not _registered_checkpoints(snapshot):
            time.sleep(0.2)
        return node_of("RayTrainWorker", cluster)

    remove_later(cluster, worker_node_after_a_checkpoint, removed)
    result = run_training(cfg)
    return {
        "test_accuracy": result.metrics["test_accuracy"],
        "resumed_from_epoch": result.metrics["resumed_from_epoch"],
        "epochs": [h["epoch"] for h in result.history],
        "removed": removed.get("node_id"),
        "in_bucket": result.checkpoint_path.startswith("s3://")
        and storage.is_file(storage.join(result.checkpoint_path, "trainer_state.json")),
    }


DRILLS = {"async_sgd": async_sgd, "train": train, "serve": serve_app}


def _rows(results: dict) -> list[tuple[str, str, str, bool]]:
    """(drill, measured, bar, met) for each drill."""
    ps, train_run, served = results["async_sgd"], results["train"], results["serve"]
    restored = [e for e in ps["events"] if e["event"] == "shard_restored"]
    lost = max((e["lost_updates"] for e in restored), default=-1)
    bound = ps["checkpoint_every"]
    return [
        (
            "async_sgd.yaml, a shard's node lost",
            f"accuracy {ps['test_accuracy']:.4f}, {len(restored)} shard(s) "
            f"restored from the bucket, at most {lost} updates lost",
            f">= 0.9, restored, <= {bound} lost",
            bool(ps["removed"])
            and bool(restored)
            and ps["in_bucket"]
            and ps["test_accuracy"] >= 0.9
            and 0 <= lost <= bound,
        ),
        (
            "train_dp.yaml, a worker's node lost",
            f"accuracy {train_run['test_accuracy']:.4f}, resumed from the "
            f"bucket's epoch-{train_run['resumed_from_epoch']} checkpoint, epochs {train_run['epochs']}",
            ">= 0.9, resumed, each epoch once",
            bool(train_run["removed"])
            and train_run["in_bucket"]
            and train_run["test_accuracy"] >= 0.9
            and train_run["resumed_from_epoch"] >= 1
            and train_run["epochs"] == [1, 2, 3, 4, 5],
        ),
        (
            "Serve app, a replica's node lost under load",
            f"{served['requests']} requests, {served['failed']} failed "
            f"{served['failed_codes']}, {served['answered_after_loss']}/{served['after_loss']} answered "
            "once settled",
            "none before, all once settled",
            bool(served["removed"])
            and served["failed_before_loss"] == 0
            and served["after_loss"] > 20
            and served["answered_after_loss"] == served["after_loss"],
        ),
    ]


def main() -> int:
    check_and_print()
    import tempfile
    from contextlib import redirect_stdout

    # A dead node is declared dead after ~3 s instead of Ray's default ~30 s (shortened for the drill).
    fast_detection = {
        "health_check_initial_delay_ms": 0,
        "health_check_period_ms": 1000,
        "health_check_failure_threshold": 3,
    }
    results = {}
    with (
        tempfile.TemporaryDirectory(prefix="scaleforge-bench-node-loss-") as folder,
        LocalS3() as s3,
        redirect_stdout(sys.stderr),
    ):
        machines = Machines(Path(folder))  # each node its own home, cache and Ray folder
        names = (f"node{index}" for index in itertools.count())

        def add_node() -> None:
            machines.add(next(names), num_cpus=2)

        machines.add(next(names), num_cpus=0, _system_config=fast_detection)
        cluster = machines.cluster
        for _ in range(3):
            add_node()
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        try:
            for name, drill in DRILLS.items():
                if results:
                    add_node()
                    cluster.wait_for_nodes()
                start = time.perf_counter()
                results[name] = drill(cluster, s3.uri(f"node-loss/{name}"))
                print(f"drill {name}: {time.perf_counter() - start:.0f} s", flush=True)
        finally:
            ray.shutdown()
            machines.shutdown()
    rows = _rows(results)
    return print_bars(rows, "drill")


if __name__ == "__main__":
    sys.exit(main())
