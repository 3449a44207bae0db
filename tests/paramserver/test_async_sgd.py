"""Parameter-server SGD on real Ray actors: equivalence, the SSP bound, convergence, bad input."""

import json
import math
import time

import numpy as np
import pytest
import torch
from conftest import REPO
from safetensors.torch import load_file

from scaleforge.config import AsyncSGDConfig, ConfigError, load_config
from scaleforge.data import load_arrays
from scaleforge.models import build_model
from scaleforge.paramserver import ParamLayout, run_async_sgd, worker_shards
from scaleforge.paramserver.consistency import SSP, Sync
from scaleforge.paramserver.preflight import check_runnable
from scaleforge.paramserver.specs import ShardSpec
from scaleforge.paramserver.worker import WeightPredictor, batches, gradient

CONFIG = REPO / "configs/async_sgd.yaml"


def _config(tmp_path, *overrides):
    return load_config(
        AsyncSGDConfig,
        CONFIG,
        [f"run.output_dir={tmp_path / 'out'}", f"artifact.dir={tmp_path / 'artifact'}", *overrides],
        preflight=check_runnable,
    )


TINY = [
    "data.num_samples=400",
    "model={name: mlp, hidden: [16]}",
    "server.optimizer=sgd",
    "server.lr=0.05",
    "server.mode=sync",
    "workers.num_workers=1",
    "workers.batch_size=16",
    "workers.epochs=1",
]


def _weights(result):
    return load_file(result.artifact / "model.safetensors")


def test_sync_one_worker_equals_plain_sgd_and_shards_do_not_matter(ray_cluster, tmp_path):
    one = run_async_sgd(_config(tmp_path / "one", *TINY, "server.num_shards=1"))
    # Three shards, async, with weight prediction: with one worker every push meets no other update, so
    # async applies exactly sync's updates and nothing is predicted; the shards split the same vector.
    three = run_async_sgd(
        _config(
            tmp_path / "three",
            *TINY,
            "server.mode=async",
            "server.num_shards=3",
            "workers.weight_prediction=true",
        )
    )

    cfg = _config(tmp_path / "plain", *TINY)
    data = load_arrays(cfg.data)
    torch.manual_seed(cfg.workers.seed)
    model = build_model(cfg.model, 40, 10)
    layout = ParamLayout.of(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=cfg.server.momentum)
    (rows,) = worker_shards(len(data.y), 1, cfg.workers.seed)
    stream = batches(data.x[rows], data.y[rows], 16, cfg.workers.seed)
    for _ in range(one.updates):
        gradient(model, layout, *next(stream))
        optimizer.step()

    assert one.updates == three.updates == 20  # 320 examples / 16 per step
    for name, tensor in model.state_dict().items():
        np.testing.assert_allclose(_weights(one)[name].numpy(), tensor.numpy(), atol=1e-5, rtol=0)
        np.testing.assert_allclose(
            _weights(three)[name].numpy(), _weights(one)[name].numpy(), atol=1e-5, rtol=0
        )
    assert max(one.staleness["clock"]) == 0 and max(one.staleness["updates"]) == 0


def test_ssp_bounds_staleness_with_a_straggler(ray_cluster, tmp_path):
    straggling = [
        "data.num_samples=800",
        "model={name: mlp, hidden: [16]}",
        "workers.num_workers=2",  # the last one straggles
        "workers.batch_size=32",
        "workers.epochs=1",
        "workers.straggler_delay_s=0.05",
    ]
    ssp = run_async_sgd(_config(tmp_path / "ssp", *straggling, "server.mode=ssp", "server.staleness_bound=1"))
    free = run_async_sgd(_config(tmp_path / "async", *straggling, "server.mode=async"))
    assert max(ssp.staleness["clock"]) <= 1
    assert max(free.staleness["clock"]) > 1, "without the bound the fast workers should run ahead"


def _restored(result) -> dict:
    (restored,) = [e for e in result.events if e["event"] == "shard_restored"]
    return restored


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,fault",
    [
        ("async", ["fault.kill_worker_at_step=100"]),
        ("ssp", ["server.checkpoint_every=50", "fault.kill_shard_at_update=130"]),
    ],
)
def test_each_mode_converges_through_a_fault(ray_cluster, tmp_path, mode, fault):
    """Async and ssp learn on two epochs of the default config, async losing a worker on the way, ssp a
    shard; sync learns through a lost shard in the next test. (The full default config reaches 0.92 in
    every mode through these faults: ``bench/training.py``.)"""
    result = run_async_sgd(_config(tmp_path, f"server.mode={mode}", "workers.epochs=2", *fault))
    # Two epochs (250 steps a worker): ssp 0.857-0.880 through the lost shard on an idle machine, async
    # 0.895-0.921. One epoch sits on the steep part of the curve (ssp 0.504-0.634), too noisy for any bar
    # that shows learning. Ssp's curve still swings at the end (0.73-0.88 within its last 60 updates with
    # two busy loops beside it), and a fresh-clone suite run ended it at 0.682, a dip from 0.761 at update
    # 389 of 471: its bar sits above one epoch's range and below that dip.
    assert result.test_accuracy >= (0.65 if mode == "ssp" else 0.75), result.summary()
    assert result.summary_path.is_file() and result.plot_path.stat().st_size > 0
    if mode == "async":  # SIGKILLed at step 100, replaced, resumed at its clock
        replaced = [e for e in result.events if e["event"] == "worker_replaced"]
        assert len(replaced) == 1 and replaced[0]["worker"] == 0 and replaced[0]["at_step"] == 100
    if mode == "ssp":  # SIGKILLed at version 130, restarted by Ray, restored from the version-100 checkpoint
        restored = _restored(result)
        assert restored["shard"] == 0 and restored["restored_version"] == 100
        assert 0 < restored["lost_updates"] <= 50, restored


@pytest.mark.slow
def test_a_killed_sync_shard_restores_and_joins_the_workers_round(ray_cluster, tmp_path):
    """Sync: the workers are rounds ahead of the restored checkpoint; the shard takes up their round."""
    result = run_async_sgd(
        _config(
            tmp_path,
            "server.mode=sync",
            "data.num_samples=8000",
            "workers.epochs=4",
            "server.checkpoint_every=50",
            "fault.kill_shard_at_update=130",
        )
    )
    restored = _restored(result)
    assert restored["shard"] == 0 and restored["restored_version"] == 100
    assert 0 < restored["lost_updates"] <= 50, restored
    assert result.test_accuracy >= 0.7, result.summary()  # trained on to the end: no round waits forever


STARTUP_S = 300
"""How long a new actor process may take to start: minutes when both xdist workers' clusters and the jobs
they run load this 2-core machine (CI's GetTimeoutError with 30 s). Calls on a started shard keep 30 s."""


def _started(shard) -> None:
    import ray

    ray.get(shard.stats.remote(), timeout=STARTUP_S)


def test_a_restarted_sync_shard_finishes_the_round_whose_ack_died_with_it(ray_cluster, tmp_path):
    """The interleaving that once hung CI: worker 0's push of the last round was acknowledged by the
    shard process that then died committing the round; only worker 1's push is retried on the
    restarted shard. Worker 0's next pull must not wait for that round forever: it reads the restored
    parameters, and its gradient on them completes the round."""
    import ray

    from scaleforge.paramserver.shard import ParameterShard

    every, die_at = 2, 3
    shard = ParameterShard.options(
        num_cpus=0.01, max_concurrency=8, max_restarts=1, max_task_retries=-1
    ).remote(
        0,
        np.zeros(4, np.float32),
        ShardSpec(
            Sync(),
            num_workers=2,
            optimizer="sgd",
            lr=0.1,
            momentum=0.0,
            checkpoint_dir=str(tmp_path),
            checkpoint_every=every,
        ),
        die_at_update=die_at,
    )
    _started(shard)
    ones = np.ones(4, np.float32)
    for clock in range(die_at - 1):  # rounds 0 and 1 committed, version 2 checkpointed
        ray.get([shard.pull.remote(w, clock) for w in (0, 1)], timeout=30)
        ray.get([shard.push.remote(w, ones, clock, clock, clock) for w in (0, 1)], timeout=30)
    last = die_at - 1
    ray.get(shard.pull.remote(0, last), timeout=30)
    ray.get(shard.pull.remote(1, last), timeout=30)
    ray.get(shard.push.remote(0, ones, last, last, last), timeout=30)  # acknowledged, then lost
    # Commits version 3 and dies; retried on a new process (whose start is slow on a loaded machine).
    ray.get(shard.push.remote(1, ones, last, last, last), timeout=STARTUP_S)
    stats = ray.get(shard.stats.remote(), timeout=30)
    assert (stats["incarnation"], stats["restored_version"]) == (1, every)
    # Worker 0's next pull travelled beside that push, sent to incarnation 0: the restarted shard never
    # sees the push, so it must not wait for it.
    flat, version = ray.get(shard.pull.remote(0, die_at, None, 0), timeout=30)[:2]  # hung here before the fix
    assert version == every  # the restored round, still waiting for worker 0's gradient
    ray.get(shard.push.remote(0, ones, version, die_at, die_at), timeout=30)
    flat, version = ray.get(shard.pull.remote(1, die_at), timeout=30)[:2]
    assert version == every + 1
    np.testing.assert_allclose(flat, -0.1 * (every + 1) * ones, rtol=1e-6)
    ray.kill(shard)


def test_backup_workers_apply_the_first_gradients_and_drop_the_late_one(ray_cluster):
    """Sync, 3 workers, b=1, a run of 2 rounds: a round is the mean of the first 2 gradients computed on
    its version; the third arrives late, is dropped and counted, and never changes the parameters. Once
    both rounds are applied, no gradient makes a third (a worker steps on while another shard lags)."""
    import ray

    from scaleforge.paramserver.shard import ParameterShard

    shard = ParameterShard.options(num_cpus=0.01, max_concurrency=8).remote(
        0,
        np.zeros(4, np.float32),
        ShardSpec(Sync(backup_workers=1), num_workers=3, optimizer="sgd", lr=0.1, momentum=0.0, rounds=2),
    )
    _started(shard)
    reads = ray.get([shard.pull.remote(w, 0) for w in range(3)], timeout=30)
    assert [version for _, version, _ in reads] == [0, 0, 0]
    ones = np.ones(4, np.float32)
    assert ray.get(shard.push.remote(0, 1 * ones, 0, 0, 0), timeout=30)[0] == 0  # waits for a second
    assert ray.get(shard.push.remote(1, 3 * ones, 0, 0, 0), timeout=30)[0] == 1  # round 0 applied
    flat, version = ray.get(shard.snapshot.remote(), timeout=30)
    np.testing.assert_allclose(flat, -0.1 * 2 * ones, rtol=1e-6)  # the mean over the two used
    assert ray.get(shard.push.remote(2, 100 * ones, 0, 0, 0), timeout=30)[0] == 1  # late: round 0 is over
    np.testing.assert_allclose(ray.get(shard.snapshot.remote(), timeout=30)[0], flat)
    stats = ray.get(shard.stats.remote(), timeout=30)
    assert stats["dropped"] == {2: 1} and stats["version"] == 1
    # The straggler is not held back: it reads version 1 at once, and its gradient on it counts.
    assert ray.get(shard.pull.remote(2, 1), timeout=30)[1] == 1
    ray.get([shard.push.remote(w, ones, 1, 1, 1) for w in (2, 0)], timeout=30)
    flat, version = ray.get(shard.snapshot.remote(), timeout=30)
    assert version == 2
    ray.get([shard.push.remote(w, ones, 2, 2, 2) for w in (0, 1)], timeout=30)  # past the run's rounds
    assert ray.get(shard.pull.remote(0, 3, None, 0), timeout=30)[1] == 2  # its push landed: it reads
    np.testing.assert_allclose(ray.get(shard.snapshot.remote(), timeout=30)[0], flat)
    assert ray.get(shard.stats.remote(), timeout=30)["dropped"] == {2: 1}
    ray.kill(shard)


def test_a_straggler_behind_backup_workers_only_loses_its_own_gradients(ray_cluster, tmp_path):
    straggling = [
        "data.num_samples=1200",
        "model={name: mlp, hidden: [16]}",
        "workers.num_workers=3",
        "workers.batch_size=32",
        # 40 rounds: the fast workers ran 20 in 0.1 s in one fresh-clone suite run, where the straggler
        # (0.05 s a step) computed a single late gradient; in 40 it computes 5-6 idle, 10-13 beside a busy
        # loop (4 runs each).
        "workers.epochs=4",
        "workers.straggler_delay_s=0.05",
        "server.mode=sync",
        "server.num_shards=2",
    ]
    cfg = _config(tmp_path, *straggling, "server.backup_workers=1")
    result = run_async_sgd(cfg)
    shard_rows = min(map(len, worker_shards(len(load_arrays(cfg.data).y), 3, cfg.workers.seed)))
    steps = math.ceil(4 * shard_rows / 32)  # 4 epochs of each worker's data shard, in batches of 32
    assert result.updates == steps, result.summary()  # the run is `steps` rounds, as without backups
    # Per shard: the straggler's gradients, late for their round. How many it computed before the fast
    # workers' last round depends on their speed.
    for dropped in result.dropped:
        assert dropped.get(2, 0) >= 2 and dropped.get(0, 0) + dropped.get(1, 0) <= 2, result.summary()
    assert max(result.staleness["updates"]) == 0, "a gradient was applied to a version it was not computed on"


@pytest.mark.parametrize("mode", ["sync", "ssp"])
def test_a_pull_beside_its_push_reads_after_the_push_lands(ray_cluster, mode):
    """A worker sends its next pull beside its push; Ray may run the pull first. The pull must then wait
    for the push: under sync it would close the round without the worker's gradient, and under SSP count
    a step whose gradient is not in; either way the worker must read its own update."""
    import ray

    from scaleforge.paramserver.shard import ParameterShard

    policy = {"sync": Sync(), "ssp": SSP(bound=0)}[mode]
    shard = ParameterShard.options(num_cpus=0.01, max_concurrency=8).remote(
        0,
        np.zeros(4, np.float32),
        ShardSpec(policy, num_workers=1, optimizer="sgd", lr=0.1, momentum=0.0),
    )
    _started(shard)
    ray.get(shard.pull.remote(0, 0), timeout=30)
    early = shard.pull.remote(0, 1, None, 0)  # the push of step 0 has not been sent yet
    assert ray.wait([early], timeout=1.0)[0] == []
    ray.get(shard.push.remote(0, np.ones(4, np.float32), 0, 0, 0), timeout=30)
    flat, version, slowest = ray.get(early, timeout=30)
    assert (version, slowest) == (1, 1)
    np.testing.assert_allclose(flat, -0.1 * np.ones(4), rtol=1e-6)
    ray.kill(shard)


def test_weight_prediction_moves_each_shard_on_by_the_updates_its_pushes_meet():
    predictor = WeightPredictor([(0, 2), (2, 4)])
    flat = np.array([1.0, 1.0, 5.0, 5.0], np.float32)
    predictor.predict(flat, [(10, 0), (10, 0)])  # a first read: nothing to predict from
    np.testing.assert_array_equal(flat, [1.0, 1.0, 5.0, 5.0])
    predictor.landed([(10, 0), (10, 0)], [(13, 0), (11, 0)])  # met 2 other updates on shard 0, none on 1
    assert predictor.staleness == [pytest.approx(0.2), 0.0]  # running means, from 0, weight 0.1

    flat[:] = [2.0, 0.0, 6.0, 6.0]  # the next read: shard 0 at version 14 (4 updates on), shard 1 at 12
    predictor.predict(flat, [(14, 0), (12, 0)])
    # shard 0 moves on by 0.2 updates of its change per update since the last read, (1, -1) / 4
    np.testing.assert_allclose(flat, [2.05, -0.05, 6.0, 6.0], rtol=1e-6)
    predictor.landed([(14, 0), (12, 0)], [(19, 0), (15, 0)])  # 4 and 2 other updates landed first
    assert predictor.staleness == [pytest.approx(0.2 + 0.1 * 3.8), pytest.approx(0.2)]

    flat[:] = [3.0, 0.0, 7.0, 7.0]  # shard 1 restarted from an older checkpoint: its version went back
    predictor.predict(flat, [(18, 0), (5, 0)])
    np.testing.assert_allclose(flat, [3.0 + 0.58 * 1.0 / 4, 0.0, 7.0, 7.0], rtol=1e-6)


def test_step_delays_are_seeded_and_hit_about_the_given_share_of_steps():
    from scaleforge.paramserver.worker import StepDelays

    first, again = StepDelays(0.01, 0.5, 0.2, seed=7), StepDelays(0.01, 0.5, 0.2, seed=7)
    delays = [first.next() for _ in range(2000)]
    assert delays == [again.next() for _ in range(2000)]  # seeded: a run's stragglers are reproducible
    slow = [d for d in delays if d > 0.01]
    assert min(delays) == 0.01 and set(slow) == {0.01 + 0.5} and 0.17 <= len(slow) / len(delays) <= 0.23
    other = StepDelays(0.01, 0.5, 0.2, seed=8)  # the next worker's seed: its own draws
    assert [other.next() for _ in range(2000)] != delays


@pytest.mark.parametrize(
    "override,message",
    [
        ("server.num_shards=0", "server.num_shards: Input should be greater than 0"),
        (
            "server.num_shards=10000000",
            "server.num_shards (10000000) is larger than the number of parameters",
        ),
        ("server.staleness_bound=-1", "server.staleness_bound: Input should be greater than or equal to 0"),
        ("workers.num_workers=0", "workers.num_workers: Input should be greater than 0"),
        ("server.optimizer=lamb", "server.optimizer: Input should be 'sgd' or 'adam'"),
        ("model.batch_norm=true", "shares parameters, not BatchNorm statistics"),
        ("server.backup_workers=1", "server.backup_workers applies to server.mode=sync, not async"),
        (
            "server.mode=sync server.backup_workers=2",
            "server.backup_workers (2) must be smaller than workers.num_workers (2)",
        ),
        (
            "workers.transient_delay_probability=0.2",
            "workers.transient_delay_probability needs workers.transient_delay_s > 0",
        ),
        (
            "server.mode=sync workers.weight_prediction=true",
            "workers.weight_prediction applies to server.mode=async or ssp",
        ),
    ],
)
def test_bad_input_is_rejected_before_anything_starts(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(AsyncSGDConfig, CONFIG, override.split(), preflight=check_runnable)
    assert message in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode", ["ssp", "sync"]
)  # async: a worker's clock only; its shards keep no rounds or bound
def test_workers_join_and_leave_while_training(ray_cluster, tmp_path, mode):
    result = run_async_sgd(
        _config(
            tmp_path,
            "data.num_samples=4000",
            "model={name: mlp, hidden: [64]}",
            "workers.batch_size=32",
            # The first workers must train for longer than 3 s, and for as long as a new worker's process
            # takes to start on a loaded machine (over 13 s seen; 3.7 s on an idle one, when 12 epochs of
            # sync rounds took 5.4 s), so no time budget here: epochs, which slow down with the machine.
            # 15 of them: 12 s a mode on an idle machine, and passed with two busy loops on both cores.
            "workers.epochs=15",
            "run.eval_every_s=0.2",
            f"server.mode={mode}",
            "workers.scaling=[{at_s: 1.5, workers: 3}, {at_s: 3, workers: 1}]",
        )
    )
    kinds = [(e["event"], e["worker"]) for e in result.events]
    assert kinds == [("worker_added", 2), ("worker_removed", 2), ("worker_removed", 1)], result.events
    added, removed = result.events[0]["seconds"], result.events[1]["seconds"]
    assert 1.5 <= added < removed and removed >= 3.0, result.events  # each change at (or after) its time
    # Training never stood still for a second: a new worker's process start-up once held every sync
    # round and SSP bound (seconds on a loaded machine); it joins once it is up.
    for point in result.curve:
        later = [p for p in result.curve if p["seconds"] >= point["seconds"] + 1.0]
        assert not later or later[0]["updates"] > point["updates"], ("stalled", point, result.events)
    assert result.test_accuracy > 0.3, result.summary()  # training went on after each change (chance: 0.1)
    summary = json.loads(result.summary_path.read_text())  # the report's timeline, drawn on its plot
    assert [n for _, n in summary["workers_over_time"]] == [2, 3, 2, 1, 1], summary["workers_over_time"]
    assert result.plot_path.stat().st_size > 0


def test_a_time_budget_ends_the_run_and_exports_the_model_as_it_stands(ray_cluster, tmp_path):
    result = run_async_sgd(
        _config(
            tmp_path,
            *TINY,
            "server.mode=async",
            "workers.epochs=1000",
            "run.eval_every_s=0.2",
            "run.max_seconds=2",
        )
    )
    (stop,) = [e for e in result.events if e["event"] == "stopped_at_time"]
    assert 2 <= stop["seconds"] < 4 and 0 < stop["updates"] < 1000 * 20, stop  # 20 steps an epoch
    assert result.curve[-1]["seconds"] == stop["seconds"]
    assert result.updates >= stop["updates"]
    from scaleforge.artifacts import load_model
    from scaleforge.data.in_memory import load_in_memory

    exported = load_in_memory(_config(tmp_path / "check", *TINY).data).score(load_model(result.artifact))
    assert exported == pytest.approx(result.test_accuracy, abs=1e-9)  # the model as it stood at the stop


def test_run_stops_once_the_target_accuracy_is_reached(ray_cluster, tmp_path):
    result = run_async_sgd(
        _config(
            tmp_path,
            "data.num_samples=4000",
            "model={name: mlp, hidden: [64]}",
            "workers.epochs=200",
            "run.eval_every_s=0.3",
            "run.stop_at_accuracy=0.4",
        )
    )
    (stop,) = [e for e in result.events if e["event"] == "stopped_at_accuracy"]
    assert stop["test_accuracy"] >= 0.4 and result.test_accuracy >= 0.4
    planned = 200 * 2000 // 64  # steps per worker; far more than it took
    assert result.updates < planned / 2, result.summary()
    assert result.curve[-1]["test_accuracy"] == stop["test_accuracy"]


def test_a_run_the_cluster_cannot_place_fails_clearly_and_frees_what_it_reserved(ray_cluster, tmp_path):
    import ray

    total = ray.cluster_resources()["CPU"]
    with pytest.raises(RuntimeError, match=r"placement_timeout_s=2 s: it needs 8.02 CPUs in 10 bundles"):
        run_async_sgd(
            _config(
                tmp_path, *TINY, "workers.num_workers=8", "server.num_shards=2", "run.placement_timeout_s=2"
            )
        )
    deadline = time.time() + 10  # the group is removed: a later run gets every CPU back
    while ray.available_resources().get("CPU", 0) < total and time.time() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == total


@pytest.mark.slow
def test_the_language_model_trains_on_parameter_servers_below_the_unigram_entropy(ray_cluster, tmp_path):
    """The decoder of ``train_lm_tiny.yaml`` as one flat vector over 2 shards: after the config's three
    epochs (76 steps a worker each) it predicts the validation bytes better than their unigram entropy,
    the best a model without context does (one epoch scored 4.71 bits/byte and two 4.24 against a bar of
    4.15: three stay). (Async; the modes share everything but the shard's rule, tested above on the
    classifier.)"""
    mode = "async"
    from scaleforge.artifacts import load_model
    from scaleforge.data.in_memory import load_in_memory
    from scaleforge.text.tokenizer import unigram_bits_per_byte

    cfg = load_config(
        AsyncSGDConfig,
        REPO / "configs/async_sgd_lm.yaml",
        [
            f"run.output_dir={tmp_path / 'out'}",
            f"artifact.dir={tmp_path / 'artifact'}",
            f"server.mode={mode}",
            "data.max_train_bytes=154000",
            "data.max_validation_bytes=30000",
        ],
        preflight=check_runnable,
    )
    result = run_async_sgd(cfg)  # 2,406 windows of 64 bytes, half a worker
    data = load_in_memory(cfg.data)
    corpus = np.concatenate([data.x.ravel(), data.x_test.ravel()]).astype(np.uint8).tobytes()
    unigram = unigram_bits_per_byte(corpus)
    assert 4.0 < unigram < 5.5, unigram  # Python source: mostly spaces and lower-case letters
    assert result.metric == "bits_per_byte" and result.score < unigram - 0.5, result.summary()
    assert result.score == pytest.approx(data.score(load_model(result.artifact)), abs=1e-6)
