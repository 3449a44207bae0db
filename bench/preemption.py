"""A spot node taken mid-epoch, with notice, from an elastic training group on bench/node_loss.py's kind
of cluster: a head and three 2-CPU raylets on one machine whose nodes share no disk (checkpoints,
artifacts and the step log go to a bucket of a real S3 server, moto's on 127.0.0.1).

    .venv/bin/python bench/preemption.py      (about 8 minutes on 2 idle cores)

``configs/train_dp.yaml`` with one worker per node (``resources_per_worker: {CPU: 2}``), step
checkpoints every 20 steps and a preemption check every 2, twice:

1. **uninterrupted**: 3 workers throughout;
2. **drained**: an elastic group, ``scaling.num_workers: {min: 1, max: 3}``. Once it has run 60 steps on
   3 workers, one worker's node is drained as a cloud's spot notice does it
   (``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds 10``) and
   removed at the deadline; once the group runs on the 2 nodes left, a fresh node joins.

Bars: no step runs twice across the drain (the workers checkpoint on the notice and take no step
until the group restarts without the node); the run goes on on 2 workers and grows back to 3; the
global batch is the same at every step (logged per step); the final test accuracy is within 0.5
point of the uninterrupted run's. The steps repeated when the group grows back (Ray Train restarts it
larger from the last checkpoint, without notice) are reported beside them.
"""

import itertools
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

import ray

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "platform"), str(REPO)]

from bars import print_bars  # noqa: E402
from node_loss_parts.nodes import node_of  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge import storage  # noqa: E402
from scaleforge.cluster.machines import Machines  # noqa: E402
from scaleforge.config import TrainJobConfig, load_config  # noqa: E402
from scaleforge.progress import ProgressChannel  # noqa: E402
from scaleforge.storage.local_s3 import LocalS3  # noqa: E402

DEADLINE_S, EVERY = 10, 20


def _config(output: str, name: str, workers: str) -> TrainJobConfig:
    return load_config(
        TrainJobConfig,
        REPO / "configs/train_dp.yaml",
        [
            "optim.epochs=10",  # 41 steps an epoch
            f"scaling.num_workers={workers}",
            "scaling.resources_per_worker={CPU: 2}",
            "scaling.resize_interval_s=5",
            f"run.checkpoint_every_steps={EVERY}",
            "run.preemption_check_every_steps=2",
            "run.max_failures=2",
            f"run.name={name}",
            f"run.storage_path={storage.join(output, 'runs')}",
            f"artifact.dir={storage.join(output, name)}",
        ],
    )


def _wait_for_step(done, events: dict, deadline_s: float = 600) -> None:
    """Until a step the driver has received satisfies ``done(entry)``; refused once the run has ended."""
    deadline = time.monotonic() + deadline_s
    while not any(done(entry) for entry in ProgressChannel.shared().records):
        if time.monotonic() > deadline or events.keys() & {"result", "error"}:
            raise TimeoutError("the run never reached the step the drill waits for")
        time.sleep(0.2)


def _take_a_node_then_add_one(machines: Machines, add_node, events: dict) -> None:
    """The drill's other side: a spot notice, the node's loss, a fresh node."""
    cluster = machines.cluster
    _wait_for_step(lambda entry: entry["workers"] == 3 and entry["step"] >= 60, events)
    node = node_of("RayTrainWorker", cluster)
    events["drained_at"] = time.time()
    subprocess.run(
        [
            str(Path(sys.executable).with_name("ray")),
            "drain-node",
            "--address",
            cluster.address,
            "--node-id",
            node.node_id,
            "--reason",
            "DRAIN_NODE_REASON_PREEMPTION",
            "--reason-message",
            "spot instance reclaimed (bench/preemption.py)",
            "--deadline-remaining-seconds",
            str(DEADLINE_S),
        ],
        check=True,
        capture_output=True,
    )
    time.sleep(max(0.0, events["drained_at"] + DEADLINE_S - time.time()))
    cluster.remove_node(node, allow_graceful=False)  # what the cloud does at the deadline
    _wait_for_step(lambda entry: entry["workers"] == 2, events)
    events["added_at"] = time.time()
    add_node()


def _drained(machines: Machines, add_node, output: str) -> dict:
    """The elastic run in a background thread, the drill here: a raylet can only be started from the
    main thread (Ray's node registers a SIGTERM handler)."""
    from scaleforge.train import run_training

    events: dict = {}
    ProgressChannel.shared().records = []  # the uninterrupted run's steps are not this run's

    def train() -> None:
        try:
            events["result"] = run_training(_config(output, "drained", "{min: 1, max: 3}"))
        except BaseException as error:  # noqa: BLE001 - re-raised in the main thread below
            events["error"] = error

    run = threading.Thread(target=train, daemon=True)
    run.start()
    try:
        _take_a_node_then_add_one(machines, add_node, events)
    finally:
        run.join()
        if "error" in events:  # what ended the run, rather than the drill's wait for it
            raise events["error"]
    return events


def _restarts(log: list[dict]) -> list[dict]:
    """Each attempt after the first: the step it resumed from, the workers it ran on, and how many of
    its steps the attempt before had run already."""
    attempts: dict[int, list[dict]] = {}
    for entry in log:
        attempts.setdefault(entry["attempt_from_step"], []).append(entry)
    starts = sorted(attempts)
    return [
        {
            "from_step": start,
            "workers": attempts[start][0]["workers"],
            "repeated": sum(1 for e in attempts[before] if e["step"] > start),
        }
        for before, start in zip(starts, starts[1:])
    ]


def _rows(plain, drained: dict) -> list:
    result = drained["result"]
    log, restarts = result.step_log, _restarts(result.step_log)
    after_drain = next((r for r in restarts if r["workers"] == 2), None)
    regrown = next((r for r in restarts if r["workers"] == 3), None)
    sizes = [e["workers"] for e in log]
    gap = result.metrics["test_accuracy"] - plain.metrics["test_accuracy"]
    print(f"restarts: {restarts}")
    return [
        (
            "steps run twice across the drain",
            f"{after_drain['repeated']} (resumed from step {after_drain['from_step']})"
            if after_drain
            else "no restart on 2 workers",
            "0",
            after_drain is not None and after_drain["repeated"] == 0,
        ),
        (
            "the group's size",
            f"{' -> '.join(str(k) for k, _ in itertools.groupby(sizes))} workers",
            "3 -> 2 -> 3",
            [k for k, _ in itertools.groupby(sizes)] == [3, 2, 3],
        ),
        (
            "steps run twice when it grew back",
            f"{regrown['repeated']} (no notice: from the last step checkpoint)"
            if regrown
            else "did not grow",
            f"< {EVERY} (run.checkpoint_every_steps)",
            regrown is not None and regrown["repeated"] < EVERY,
        ),
        (
            "global batch at every step",
            f"{sorted({e['global_batch'] for e in log})} rows over {len(log)} logged steps",
            "one size",
            len({e["global_batch"] for e in log}) == 1,
        ),
        (
            "final test accuracy",
            f"{result.metrics['test_accuracy']:.4f} vs {plain.metrics['test_accuracy']:.4f} uninterrupted "
            f"({gap:+.4f})",
            "within 0.005",
            abs(gap) <= 0.005,
        ),
    ]


def main() -> int:
    check_and_print()
    from scaleforge.train import run_training

    with (
        tempfile.TemporaryDirectory(prefix="scaleforge-bench-preemption-") as folder,
        LocalS3() as s3,
        redirect_stdout(sys.stderr),
    ):
        machines = Machines(Path(folder))
        names = (f"node{index}" for index in itertools.count())

        def add_node() -> None:
            machines.add(next(names), num_cpus=2)

        machines.add(next(names), num_cpus=1)  # the head: room for Ray Data, none for a worker
        for _ in range(3):
            add_node()
        ray.init(address=machines.cluster.address, logging_level="ERROR", log_to_driver=False)
        try:
            started = time.perf_counter()
            plain = run_training(_config(s3.uri("preemption"), "uninterrupted", "3"))
            print(f"uninterrupted: {time.perf_counter() - started:.0f} s", flush=True)
            started = time.perf_counter()
            drained = _drained(machines, add_node, s3.uri("preemption"))
            print(f"drained: {time.perf_counter() - started:.0f} s", flush=True)
        finally:
            ray.shutdown()
            machines.shutdown()
    print(drained["result"].summary())
    return print_bars(_rows(plain, drained), "drill")


if __name__ == "__main__":
    sys.exit(main())
