"""The report stage: a final table, a markdown file and the plots a person would rather look at.

It reads the records of the stages before it and nothing else (no serve config, no model), so
``--from report`` rewrites it from a finished run's records.
"""

import statistics

from scaleforge.compress.report import slim_sentence
from scaleforge.pipeline.base import PipelineStage, StageContext
from scaleforge.pipeline.records import Placement, Records, ReportRecord, ServedModelResult
from scaleforge.plots import pyplot
from scaleforge.storage import join, read_bytes, write_atomic

PLOTS = {
    "training_curves.png": "Training curves (test accuracy per epoch)",
    "sync_vs_async.png": "Parameter server: accuracy over wall-clock, per consistency mode",
    "compression_accuracy_vs_size.png": "Compression: accuracy against size and latency",
    "cascade_accuracy_vs_cost.png": "Cascade: accuracy against the share of inputs escalated",
}


class ReportStage(PipelineStage):
    """``report/report.md`` and its plots in the output folder."""

    name = "report"
    record = ReportRecord
    reusable = False
    uses_ray = False

    def run(self, ctx: StageContext) -> ReportRecord:
        return ReportRecord(report=type(self).write(ctx.records, join(ctx.out, "report")))

    @staticmethod
    def write(records: Records, folder: str) -> str:
        """``report.md`` and its plots from the records alone; returns the markdown's location."""
        return write_report(records, folder)


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
    cascade, last = records.calibrate.cascade, records.calibrate.stages[-1]
    if {cascade, last} <= query.models.keys():
        lines.append(cascade_against_last_stage(query.models[cascade], query.models[last], last))
    lines.append(f"compressed model: {slim_sentence(records.compress.report.model_dump())}")
    runs = records.async_sgd.runs
    lines.append(
        "parameter server: "
        + ", ".join(f"{mode} {run.test_accuracy:.4f} in {run.wall_s:.0f} s" for mode, run in runs.items())
    )
    lines.append(placement_line(query.placement))
    lines.append(f"pipeline wall-clock: {query.pipeline_wall_s:.0f} s")
    return "\n".join(lines)


def cascade_against_last_stage(cascade: ServedModelResult, last: ServedModelResult, name: str) -> str:
    """What the cascade's routing buys over serving its last stage alone, measured under the same load:
    the median of the pass-by-pass ratios, each pass's beside it."""
    ratios = cascade.ratios_per_pass(last)
    passes = f" (median of {len(ratios)} passes: {' '.join(f'{r:.2f}x' for r in ratios)})"
    return (
        f"cascade against the {name}: {statistics.median(ratios):.2f}x the inputs/s"
        f"{passes if len(ratios) > 1 else ''}, accuracy {cascade.accuracy - last.accuracy:+.4f}"
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
    _training_curves(records, join(folder, "training_curves.png"))
    _sync_vs_async(records, join(folder, "sync_vs_async.png"))
    write_atomic(
        join(folder, "compression_accuracy_vs_size.png"),
        read_bytes(join(records.compress.output, "accuracy_vs_size_latency.png")),
    )
    _cascade_curve(records, join(folder, "cascade_accuracy_vs_cost.png"))
    calibrate = records.calibrate
    cascade = (
        f"Cascade thresholds {calibrate.thresholds} calibrated on validation data: held-out accuracy "
        f"{calibrate.accuracy:.4f} against {calibrate.last_stage_accuracy:.4f} for the "
        f"{calibrate.stages[-1]} alone, "
        "answered per stage " + " / ".join(f"{s:.1%}" for s in calibrate.answered_per_stage) + "."
    )
    return write_markdown(folder, "scaleforge pipeline report", final_table(records), [cascade, ""], PLOTS)


def write_markdown(folder: str, title: str, table: str, body: list[str], plots: dict[str, str]) -> str:
    """``report.md`` in ``folder``: ``title``, the final ``table``, the ``body`` lines, then each plot (file
    name -> caption) under a heading; returns its location."""
    markdown = [f"# {title}", "", "```", table, "```", "", *body]
    for name, caption in plots.items():
        markdown += [f"## {caption}", "", f"![{caption}]({name})", ""]
    path = join(folder, "report.md")
    write_atomic(path, "\n".join(markdown))
    return path


def new_figure():
    plt = pyplot()

    figure, axis = plt.subplots(figsize=(6, 4))
    axis.grid(alpha=0.3)
    return plt, figure, axis


def save_figure(plt, figure, axis, path: str) -> None:
    axis.legend(loc="best")  # named: matplotlib warns on the console when a defaulted "best" takes over 1 s
    write_atomic(path, lambda out: figure.savefig(out, format="png", dpi=100, bbox_inches="tight"))
    plt.close(figure)


def _training_curves(records: Records, path: str) -> None:
    plt, figure, axis = new_figure()
    for stage, trained in (("teacher", records.teacher), ("moe", records.moe)):
        history = trained.history
        axis.plot([h.epoch for h in history], [h.test_accuracy for h in history], marker="o", label=stage)
    axis.set(xlabel="epoch", ylabel="test accuracy", title="Data-parallel training on Ray Train")
    save_figure(plt, figure, axis, path)


def _sync_vs_async(records: Records, path: str) -> None:
    plt, figure, axis = new_figure()
    for mode, run in records.async_sgd.runs.items():
        axis.plot([p.seconds for p in run.curve], [p.test_accuracy for p in run.curve], label=mode)
    axis.set(xlabel="wall-clock (s)", ylabel="test accuracy", title="Parameter server: sync against async")
    save_figure(plt, figure, axis, path)


def _cascade_curve(records: Records, path: str) -> None:
    """Accuracy against cost on the held-out inputs, at every threshold the calibrate stage recorded,
    the calibrated thresholds marked."""
    calibrated = records.calibrate
    plt, figure, axis = new_figure()
    axis.plot(
        [p.escalated for p in calibrated.curve],
        [p.accuracy for p in calibrated.curve],
        marker=".",
        label="thresholds 0 to 1",
    )
    axis.scatter(
        [1 - calibrated.answered_per_stage[0]],
        [calibrated.accuracy],
        color="red",
        zorder=3,
        label="calibrated",
    )
    last = calibrated.stages[-1]
    axis.axhline(calibrated.last_stage_accuracy, color="gray", linestyle="--", label=f"{last} alone")
    axis.set(
        xlabel="share of inputs escalated past the first stage (cost)",
        ylabel="test accuracy",
        title=f"Cascade {calibrated.cascade}: accuracy against cost",
    )
    save_figure(plt, figure, axis, path)
