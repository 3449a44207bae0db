"""The main job's report: a final table, a markdown file and the plots a person would rather look at."""

import torch

from scaleforge.artifacts.servable import load_servable
from scaleforge.compress.report import slim_sentence
from scaleforge.config import ServeConfig, load_config
from scaleforge.config.routers import CascadeEntry
from scaleforge.pipeline.query import test_set
from scaleforge.pipeline.records import Placement, Records, ServedModelResult
from scaleforge.routing.cascade import simulate_cascade
from scaleforge.storage import join, read_bytes, write_atomic

PLOTS = {
    "training_curves.png": "Training curves (test accuracy per epoch)",
    "sync_vs_async.png": "Parameter server: accuracy over wall-clock, per consistency mode",
    "compression_accuracy_vs_size.png": "Compression: accuracy against size and latency",
    "cascade_accuracy_vs_cost.png": "Cascade: accuracy against the share of inputs escalated",
}


def final_table(records: Records) -> str:
    """One row per served model, then sizes and speedups of the compressed model."""
    query = records.query
    lines = [f"{'served model':14s} {'accuracy':>8s} {'p50 ms':>7s} {'p99 ms':>7s} {'inputs/s':>9s}  routing"]
    for name, row in query.models.items():
        routing = ""
        if row.answered_per_stage is not None:
            routing = "answered per stage " + " / ".join(f"{s:.0%}" for s in row.answered_per_stage)
        if row.first_expert_share is not None:
            routing = (
                "first expert "
                + " ".join(f"{s:.0%}" for s in row.first_expert_share)
                + f"; fallbacks {row.fallbacks}"
            )
        lines.append(
            f"{name:14s} {row.accuracy:8.4f} {row.p50_ms:7.1f} {row.p99_ms:7.1f} "
            f"{row.inputs_per_s:9.0f}  {routing}".rstrip()
        )
    lines.append(
        "queried at the ingress replica's own port (direct ingress)"
        if query.direct
        else "queried through Serve's HTTP proxy"
    )
    if {"cascade", "teacher"} <= query.models.keys():
        lines.append(cascade_against_teacher(query.models["cascade"], query.models["teacher"]))
    lines.append(f"compressed model: {slim_sentence(records.compress.report.model_dump())}")
    runs = records.async_sgd.runs
    lines.append(
        "parameter server: "
        + ", ".join(f"{mode} {run.test_accuracy:.4f} in {run.wall_s:.0f} s" for mode, run in runs.items())
    )
    lines.append(placement_line(query.placement))
    lines.append(f"pipeline wall-clock: {query.pipeline_wall_s:.0f} s")
    return "\n".join(lines)


def cascade_against_teacher(cascade: ServedModelResult, teacher: ServedModelResult) -> str:
    """What the cascade's routing buys over serving the teacher alone, measured under the same load."""
    return (
        f"cascade against the teacher: {cascade.inputs_per_s / teacher.inputs_per_s:.2f}x the inputs/s, "
        f"accuracy {cascade.accuracy - teacher.accuracy:+.4f}"
    )


def placement_line(placement: Placement) -> str:
    """Where the served models were placed, and why."""
    if not placement.enabled:
        return "placement: off (Ray's default)"
    nodes = f"{placement.cpu_nodes} CPU-only and {placement.gpu_nodes} GPU node(s) measured"
    if placement.cpu_nodes and placement.gpu_nodes:
        placed = ", ".join(f"{name} on {kind}" for name, kind in placement.models.items() if kind != "any")
        return f"placement: {nodes}; {placed}"
    return f"placement: {nodes}; one kind of node, Ray's default placement"


def write_report(records: Records, folder: str) -> str:
    """``report.md`` and its plots in ``folder`` (a local folder or a URI); returns the markdown's
    location."""
    import matplotlib

    matplotlib.use("Agg")
    _training_curves(records, join(folder, "training_curves.png"))
    _sync_vs_async(records, join(folder, "sync_vs_async.png"))
    write_atomic(
        join(folder, "compression_accuracy_vs_size.png"),
        read_bytes(join(records.compress.output, "accuracy_vs_size_latency.png")),
    )
    _cascade_curve(records, join(folder, "cascade_accuracy_vs_cost.png"))
    calibrate = records.calibrate
    markdown = [
        "# scaleforge pipeline report",
        "",
        "```",
        final_table(records),
        "```",
        "",
        f"Cascade thresholds {calibrate.thresholds} calibrated on validation data: held-out accuracy "
        f"{calibrate.accuracy:.4f} against {calibrate.last_stage_accuracy:.4f} for the teacher alone, "
        "answered per stage " + " / ".join(f"{s:.1%}" for s in calibrate.answered_per_stage) + ".",
        "",
    ]
    for name, title in PLOTS.items():
        markdown += [f"## {title}", "", f"![{title}]({name})", ""]
    path = join(folder, "report.md")
    write_atomic(path, "\n".join(markdown))
    return path


def _figure():
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    axis.grid(alpha=0.3)
    return plt, figure, axis


def _save(plt, figure, axis, path: str) -> None:
    axis.legend(loc="best")  # named: matplotlib warns on the console when a defaulted "best" takes over 1 s
    write_atomic(path, lambda out: figure.savefig(out, format="png", dpi=100, bbox_inches="tight"))
    plt.close(figure)


def _training_curves(records: Records, path: str) -> None:
    plt, figure, axis = _figure()
    for stage, trained in (("teacher", records.teacher), ("moe", records.moe)):
        history = trained.history
        axis.plot([h.epoch for h in history], [h.test_accuracy for h in history], marker="o", label=stage)
    axis.set(xlabel="epoch", ylabel="test accuracy", title="Data-parallel training on Ray Train")
    _save(plt, figure, axis, path)


def _sync_vs_async(records: Records, path: str) -> None:
    plt, figure, axis = _figure()
    for mode, run in records.async_sgd.runs.items():
        axis.plot([p.seconds for p in run.curve], [p.test_accuracy for p in run.curve], label=mode)
    axis.set(xlabel="wall-clock (s)", ylabel="test accuracy", title="Parameter server: sync against async")
    _save(plt, figure, axis, path)


def _cascade_curve(records: Records, path: str) -> None:
    """Every threshold's accuracy and escalation share on the test set, the calibrated one marked."""
    app = load_config(ServeConfig, records.calibrate.serve_config).applications[0].args
    cascade = app.routers_of(CascadeEntry)[0]
    models = [load_servable(app.model(stage.model).artifact).module for stage in cascade.stages]
    x, y = (torch.from_numpy(a) for a in test_set(records.calibrate))
    with torch.inference_mode():
        probs = [model(x).softmax(-1) for model in models]
    points = []
    for threshold in torch.linspace(0, 1, 41).tolist():
        result = simulate_cascade(probs, [threshold] * (len(probs) - 1), cascade.measure)
        points.append((1 - result.answered_at(0), float((result.predictions == y).float().mean())))
    plt, figure, axis = _figure()
    axis.plot(*zip(*points), marker=".", label="thresholds 0 to 1")
    chosen = simulate_cascade(probs, records.calibrate.thresholds, cascade.measure)
    axis.scatter(
        [1 - chosen.answered_at(0)],
        [float((chosen.predictions == y).float().mean())],
        color="red",
        zorder=3,
        label="calibrated",
    )
    axis.axhline(
        float((probs[-1].argmax(-1) == y).float().mean()), color="gray", linestyle="--", label="teacher alone"
    )
    axis.set(
        xlabel="share of inputs escalated to the teacher (cost)",
        ylabel="test accuracy",
        title="Cascade: accuracy against cost",
    )
    _save(plt, figure, axis, path)
