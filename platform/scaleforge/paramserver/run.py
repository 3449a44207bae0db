"""Drive a parameter-server run: ``run_async_sgd`` builds its controller, ``ParameterServerRun``, and
steps it through start, training (supervision, scaling, evaluation) and export; however the run ends,
the cluster gets its resources back."""

import time
import uuid
from typing import Optional

import numpy as np
import ray
import torch

from scaleforge.artifacts import save_artifact
from scaleforge.config.async_sgd import AsyncSGDConfig
from scaleforge.data import localized
from scaleforge.data.in_memory import METRICS, InMemoryData, load_in_memory
from scaleforge.models import build_model
from scaleforge.paramserver.fleet import Fleet
from scaleforge.paramserver.layout import ParamLayout
from scaleforge.paramserver.plan import RunPlan, worker_shards
from scaleforge.paramserver.report import AsyncSGDResult, shard_restarts, write_report
from scaleforge.runtime import ensure_ray

__all__ = ["ParameterServerRun", "held_out_score", "run_async_sgd", "worker_shards"]


def run_async_sgd(cfg: AsyncSGDConfig) -> AsyncSGDResult:
    """Train ``cfg.model`` with SGD on parameter-server shards; export the model and a run summary."""
    launched = time.perf_counter()
    workers = cfg.workers
    ensure_ray(min_cpus=max([workers.num_workers] + [e.workers for e in workers.scaling]) + 1)
    data = load_in_memory(cfg.data)
    torch.manual_seed(workers.seed)
    model = build_model(cfg.model, data.info.input_dim, data.info.num_classes)
    run = ParameterServerRun(cfg, data, model, launched)
    try:
        run.start()
        run.train()
        return run.export()
    finally:  # whatever happened (an error, a timeout, Ctrl-C), give the cluster its resources back
        run.fleet.close()


def held_out_score(model: torch.nn.Module, data: InMemoryData) -> float:
    """Test accuracy, or a language model's validation bits per byte, on the full held-out set and on
    one thread: evaluation runs while workers train and must not take their cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return data.score(model)
    finally:
        torch.set_num_threads(threads)


class ParameterServerRun:
    """One run's state and the steps that change it: start the shards and workers, replace the dead,
    apply scaling, evaluate, stop, export. ``fleet`` holds the actors and the placement group.

    ``running`` maps each worker's ``run`` call in flight to the worker's index; ``starting`` the
    ``ready`` call of each worker added by scaling, until its process is up; ``removed`` holds the
    workers scaling took away (a killed one may linger in ``running`` for a moment).
    """

    def __init__(self, cfg: AsyncSGDConfig, data: InMemoryData, model: torch.nn.Module, launched: float):
        self.cfg, self.data, self.model, self.launched = cfg, data, model, launched
        self.plan = RunPlan(cfg, data, ParamLayout.of(model), run_token=uuid.uuid4().hex[:12])
        self.fleet = Fleet(cfg.workers.num_workers, cfg.server.num_shards, self.plan.run_token)
        self.label, self.metric = f"[{cfg.server.mode}]", METRICS[data.metric]
        self.scaling = list(cfg.workers.scaling)  # the steps still to apply, in order
        self.running: dict = {}
        self.starting: dict = {}
        self.removed: set[int] = set()
        self.curve: list[dict] = []
        self.reports: list[dict] = []
        self.events: list[dict] = []
        self.started: Optional[float] = None

    def start(self) -> None:
        """Reserve the cluster, start the shards, then the workers; the clock starts once every worker
        is up (process start-up is not training time)."""
        plan, fault = self.plan, self.cfg.fault
        self.fleet.reserve(self.cfg.run.placement_timeout_s)
        self.fleet.start_shards(plan.initial_slices(), plan.shard_spec(), fault.kill_shard_at_update)
        for i in range(self.cfg.workers.num_workers):
            die_at_step = fault.kill_worker_at_step if i == 0 else None
            self.fleet.start_worker(plan.replica_spec(i, self.fleet.shards, die_at_step))
        ray.get([w.ready.remote() for w in self.fleet.workers])
        self.started = time.perf_counter()
        self.running = {w.run.remote(plan.steps): i for i, w in enumerate(self.fleet.workers)}

    def train(self) -> None:
        """Supervise the workers until all are done or the run stops early, measuring as it goes."""
        while self.running:
            running = list(self.running)
            done, _ = ray.wait(running, num_returns=len(running), timeout=self.cfg.run.eval_every_s)
            for ref in done:
                self._collect(ref)
            self.apply_scaling()
            self.admit_started()
            point = self.evaluate()
            stop = self.plan.stop_event(point) if self.running else None
            if stop:
                self.stop(stop)

    def replace_dead(self, index: int) -> None:
        """Worker ``index``'s process died: a new one resumes from the steps every shard has of it."""
        clock = min(ray.get([s.clock_of.remote(index) for s in self.fleet.shards]))
        self._event("worker_replaced", worker=index, at_step=clock)
        print(f"{self.label} worker {index} died at step {clock}; replaced, resuming", flush=True)
        worker = self.fleet.start_worker(self.plan.replica_spec(index, self.fleet.shards))
        self.running[worker.run.remote(self.plan.steps - clock, first_clock=clock)] = index

    def apply_scaling(self) -> None:
        """Apply the scaling steps that are due, in order, each once the workers the one before added
        are up: start the workers to add, remove the newest ones to remove."""
        while self.scaling and self.scaling[0].at_s <= self._seconds() and self.running and not self.starting:
            target = self.scaling.pop(0).workers
            active = sorted(i for i in self.running.values() if i not in self.removed)
            first = len(self.fleet.workers)
            for index in range(first, first + max(0, target - len(active))):
                worker = self.fleet.start_worker(self.plan.replica_spec(index, self.fleet.shards))
                self.starting[worker.ready.remote()] = index
            for index in active[::-1][: max(0, len(active) - target)]:
                self._remove(index)
            print(f"{self.label} scaling to {target} workers ({len(active)} were training)", flush=True)

    def admit_started(self) -> None:
        """Each worker added by scaling whose process is up joins, level with the slowest: a sync round
        or the SSP bound never waits on a process that is still starting (the others train on)."""
        if not self.starting:
            return
        up, _ = ray.wait(list(self.starting), num_returns=len(self.starting), timeout=0)
        shards = self.fleet.shards
        for ref in up:
            index = self.starting.pop(ref)
            clock = ray.get(shards[0].slowest_clock.remote())
            ray.get([s.join.remote(index, clock) for s in shards])
            steps = max(1, self.plan.steps - clock)
            self.running[self.fleet.workers[index].run.remote(steps, first_clock=clock)] = index
            self._event("worker_added", worker=index)

    def evaluate(self) -> dict[str, float]:
        """Score the shards' parameters as they stand on the held-out set: the next point of the curve."""
        snapshots = ray.get([s.snapshot.remote() for s in self.fleet.shards])
        self.plan.layout.assign(self.model, np.concatenate([flat for flat, _ in snapshots]))
        point = {
            "seconds": self._seconds(),
            "updates": int(snapshots[0][1]),
            self.metric: held_out_score(self.model, self.data),
        }
        self.curve.append(point)
        print(
            f"{self.label} {point['seconds']:6.1f}s  updates {point['updates']:6d}  "
            f"{self.metric} {point[self.metric]:.4f}",
            flush=True,
        )
        return point

    def stop(self, event: dict) -> None:
        """End the run early (``event`` says why): the workers still training are killed."""
        self.events.append(event)
        for index in self.running.values():
            ray.kill(self.fleet.workers[index])
        self.running.clear()

    def export(self) -> AsyncSGDResult:
        """The run's result; its model (as the shards hold it at the last measurement) as an artifact
        in ``artifact.dir``, its summary and plot in ``run.output_dir``."""
        cfg, info, server = self.cfg, self.data.info, self.cfg.server
        result = self._result(time.perf_counter() - self.started)
        result.artifact = save_artifact(
            cfg.artifact.dir,
            self.model,
            cfg.model,
            input_dim=info.input_dim,
            num_classes=info.num_classes,
            metrics={result.metric: result.score},
            dataset={"source": localized(cfg.data).source, "fingerprint": self.data.fingerprint},
            extra={
                "training": {
                    "job": "async_sgd",
                    "mode": server.mode,
                    "num_shards": server.num_shards,
                    "num_workers": cfg.workers.num_workers,
                },
                **self.data.tokenizer_entry,
            },
        )
        result.summary_path, result.plot_path = write_report(self.plan.output, cfg, result)
        return result

    def _result(self, wall: float) -> AsyncSGDResult:
        stats = ray.get([s.stats.remote() for s in self.fleet.shards])
        staleness = {kind: [v for s in stats for v in s["staleness"][kind]] for kind in ("clock", "updates")}
        return AsyncSGDResult(
            self.cfg.server.mode,
            self.curve[-1][self.metric],
            stats[0]["version"],
            wall,
            staleness,
            self.curve,
            events=self.events + shard_restarts(stats, self.reports),
            startup_s=self.started - self.launched,
            dropped=[s["dropped"] for s in stats],
            num_workers=self.cfg.workers.num_workers,
            metric=self.metric,
        )

    def _collect(self, ref) -> None:
        """A worker's ``run`` ended: keep its report and take it off every shard (a sync round with
        backup workers must not wait for a worker that has no step left, or a straggler's last
        gradient, admitted to a round the others will never join, waits for ever) or, if its process
        died, replace it."""
        index = self.running.pop(ref)
        try:
            self.reports.append(ray.get(ref))
        except ray.exceptions.RayActorError:
            if index not in self.removed:
                self.replace_dead(index)
            return
        ray.get([s.leave.remote(index) for s in self.fleet.shards])

    def _remove(self, index: int) -> None:
        """Scaling down: worker ``index`` leaves every shard first (no sync round or SSP bound waits
        for it any more), then its process ends."""
        self.removed.add(index)
        ray.get([s.leave.remote(index) for s in self.fleet.shards])
        ray.kill(self.fleet.workers[index])
        self._event("worker_removed", worker=index)

    def _seconds(self) -> float:
        return time.perf_counter() - self.started

    def _event(self, kind: str, **fields) -> None:
        self.events.append({"seconds": self._seconds(), "event": kind, **fields})
