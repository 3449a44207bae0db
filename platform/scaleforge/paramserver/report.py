"""What a parameter-server run produced: the result, its summary line, its JSON record and plot."""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

from scaleforge.config.async_sgd import AsyncSGDConfig
from scaleforge.plots import pyplot
from scaleforge.storage import join, write_atomic

LABELS = {"test_accuracy": "test accuracy", "bits_per_byte": "validation bits/byte"}


@dataclass
class AsyncSGDResult:
    """What a parameter-server run produced."""

    mode: str
    score: float
    """The held-out score at the end: test accuracy, or a language model's validation bits per byte
    (``metric``)."""
    updates: int
    wall_s: float
    staleness: dict[str, list[int]]
    curve: list[dict[str, float]] = field(repr=False)
    events: list[dict[str, Any]] = field(default_factory=list)
    startup_s: float = 0.0
    """Seconds from the start of the run until every worker was up (not counted in ``wall_s``)."""
    dropped: list[dict[int, int]] = field(default_factory=list)
    """Per shard, the gradients each worker pushed after their round was applied (sync with backup
    workers): dropped, never applied."""
    num_workers: int = 0
    """Workers at the start (scaling events change it)."""
    metric: str = "test_accuracy"
    """``test_accuracy`` or ``bits_per_byte``: the key of ``score`` in each point of ``curve``."""
    artifact: Union[Path, str] = None
    summary_path: Union[Path, str] = None
    plot_path: Union[Path, str] = None

    @property
    def test_accuracy(self) -> float:
        if self.metric != "test_accuracy":
            raise AttributeError(f"a language model's run is scored in {self.metric}, not test accuracy")
        return self.score

    def summary(self) -> str:
        clock = np.array(self.staleness["clock"]) if self.staleness["clock"] else np.zeros(1)
        updates = np.array(self.staleness["updates"]) if self.staleness["updates"] else np.zeros(1)
        return "\n".join(
            [
                f"[{self.mode}] {LABELS[self.metric]} {self.score:.4f}; "
                f"{self.updates} updates in {self.wall_s:.1f} s "
                f"({self.updates / self.wall_s:.1f} updates/s) after {self.startup_s:.1f} s of start-up",
                f"staleness: clock max {clock.max()} (mean {clock.mean():.2f}); updates max {updates.max()} "
                f"(mean {updates.mean():.2f})",
                *(f"dropped as late (shard {i}, by worker): {d}" for i, d in enumerate(self.dropped) if d),
                *(f"event: {e}" for e in self.events),
                f"artifact: {self.artifact}",
                f"summary: {self.summary_path}  plot: {self.plot_path}",
            ]
        )


def workers_over_time(result: AsyncSGDResult) -> list[tuple[float, int]]:
    """(seconds, workers training) at the start, at each scaling event and at the end of the run."""
    count, timeline = result.num_workers, [(0.0, result.num_workers)]
    for event in result.events:
        step = {"worker_added": 1, "worker_removed": -1}.get(event["event"])
        if step:
            count += step
            timeline.append((event["seconds"], count))
    return timeline + [(result.wall_s, count)]


def shard_restarts(stats: list[dict], reports: list[dict]) -> list[dict]:
    """For each restarted shard (``stats``, by shard): the version it restored and the acknowledged
    updates it lost (the highest version its first process acknowledged in the workers' ``reports``)."""
    events = []
    for index, shard in enumerate(stats):
        if shard["incarnation"] == 0:
            continue
        acked_before = max((r["acked"][index].get(0, 0) for r in reports), default=0)
        events.append(
            {
                "event": "shard_restored",
                "shard": index,
                "restored_version": shard["restored_version"],
                "lost_updates": max(0, acked_before - shard["restored_version"]),
            }
        )
    return events


def write_report(
    output: str, cfg: AsyncSGDConfig, result: AsyncSGDResult
) -> tuple[Union[Path, str], Union[Path, str]]:
    """``summary_<mode>.json`` (staleness histograms, events, accuracy over time, the config) and
    ``accuracy_<mode>.png`` in ``output`` (a folder or a URI); returns both locations."""
    plt = pyplot()

    mode = result.mode
    summary: dict[str, Any] = {
        "mode": mode,
        result.metric: result.score,
        "updates": result.updates,
        "wall_s": result.wall_s,
        "startup_s": result.startup_s,
        "updates_per_s": result.updates / result.wall_s,
        "staleness_histogram": {
            kind: {str(k): int(v) for k, v in zip(*np.unique(values, return_counts=True))}
            for kind, values in result.staleness.items()
        },
        "dropped_by_shard": [{str(w): n for w, n in d.items()} for d in result.dropped],
        "events": result.events,
        "workers_over_time": workers_over_time(result),
        "accuracy_over_time": result.curve,
        "config": cfg.model_dump(mode="json"),
    }
    summary_path = write_atomic(join(output, f"summary_{mode}.json"), json.dumps(summary, indent=2) + "\n")
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.plot(
        [p["seconds"] for p in result.curve], [p[result.metric] for p in result.curve], marker=".", label=mode
    )
    axis.set(xlabel="wall-clock (s)", ylabel=LABELS[result.metric], title=f"Parameter server, {mode}")
    axis.grid(alpha=0.3)
    timeline = workers_over_time(result)
    if len({n for _, n in timeline}) > 1:  # the workers changed while training: show when
        workers_axis = axis.twinx()
        workers_axis.step(
            [t for t, _ in timeline],
            [n for _, n in timeline],
            where="post",
            color="tab:orange",
            label="workers",
        )
        workers_axis.set_ylabel("workers training")
        workers_axis.set_ylim(0, max(n for _, n in timeline) + 1)
        workers_axis.legend(loc="lower right")
    axis.legend(loc="upper left")
    plot_path = write_atomic(
        join(output, f"accuracy_{mode}.png"),
        lambda out: figure.savefig(out, format="png", dpi=100, bbox_inches="tight"),
    )
    plt.close(figure)
    return summary_path, plot_path
