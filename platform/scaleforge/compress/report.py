"""``report.json``, ``report.md`` and PNG plots of a compression run, every model against the teacher.

Every model is scored by one metric (``report["metric"]``): test accuracy for a classifier, or
validation bits per byte for a language model, where lower is better; rows carry it under its name.
"""

import json
from typing import Any

from scaleforge.compress.measure import StepRecord
from scaleforge.plots import pyplot
from scaleforge.storage import join, write_atomic

# Per metric: its name in a table, the column of its change against the teacher, an axis label.
_LABELS = {
    "accuracy": ("accuracy", "drop (pts)", "test accuracy"),
    "bits_per_byte": ("bits/byte", "increase", "validation bits per byte (lower is better)"),
}


def slim_sentence(report: dict[str, Any]) -> str:
    """The recipe's result in one sentence: sizes, speed-up and quality against the teacher."""
    teacher, slim = report["teacher"], report["recipe"][-1]
    vs, metric = slim["vs_teacher"], report.get("metric", "accuracy")
    batch = max(vs["speedup"], key=int)
    quality = (
        f"accuracy {slim['accuracy']:.4f} against {teacher['accuracy']:.4f}"
        if metric == "accuracy"
        else f"validation bits/byte {slim[metric]:.3f} against {teacher[metric]:.3f}"
    )
    return (
        f"{slim['parameters']:,} weights, {slim['bytes']:,} bytes against the teacher's {teacher['bytes']:,} "
        f"({vs['smaller']:.1f}x smaller), {vs['speedup'][batch]:.1f}x faster at batch {batch}, {quality}"
    )


def write_report(out: str, measured: dict[str, Any], cfg, wall_s: float) -> dict[str, Any]:
    """Write the three outputs into ``out`` (a folder or a URI) and return the JSON report."""
    teacher: StepRecord = measured["teacher"]
    report = {
        "metric": teacher.metric,
        "teacher": _row(teacher, teacher),
        "recipe": [_row(record, teacher) for record in measured["recipe"]],
        "sweeps": {
            name: [_row(record, teacher) for record in records]
            for name, records in measured["sweeps"].items()
        },
        "measure": cfg.measure.model_dump(),
        "torch_threads": cfg.measure.threads,
        "wall_s": wall_s,
    }
    write_atomic(join(out, "report.json"), json.dumps(report, indent=2) + "\n")
    write_atomic(join(out, "report.md"), _markdown(report))
    if report["metric"] == "accuracy":  # a language model is not pruned: no sparsity to plot
        _plot_sparsity(report, join(out, "accuracy_vs_sparsity.png"))
    _plot_tradeoffs(report, join(out, _tradeoff_plot(report["metric"])))
    return report


def _tradeoff_plot(metric: str) -> str:
    return f"{metric}_vs_size_latency.png"


def _row(record: StepRecord, teacher: StepRecord) -> dict[str, Any]:
    row = record.as_dict()
    if record.metric == "accuracy":
        quality = {
            "accuracy_drop_points": round((teacher.score - record.score) * 100, 3),
            "accuracy_retained": record.score / teacher.score,
        }
    else:
        quality = {f"{record.metric}_increase": record.score - teacher.score}
    row["vs_teacher"] = {
        **quality,
        "fewer_parameters": teacher.parameters / record.parameters,
        "smaller": teacher.bytes / record.bytes,
        "speedup": {str(batch): teacher.latency_ms[batch] / ms for batch, ms in record.latency_ms.items()},
    }
    return row


def _markdown(report: dict[str, Any]) -> str:
    batches, metric = list(report["teacher"]["latency_ms"]), report["metric"]
    name, change, _ = _LABELS[metric]
    header = (
        f"| model | step | {name} | {change} | weights | bytes | smaller | "
        + " | ".join(f"ms @ {b} | speed-up @ {b}" for b in batches)
        + " | details |"
    )
    rule = "|" + "---|" * (header.count("|") - 1)
    lines = [
        "# Compression report",
        "",
        f"Teacher: `{report['teacher']['artifact']}`. Latency: median of {report['measure']['repeats']} "
        f"forward passes on CPU, torch.set_num_threads({report['torch_threads']}), "
        "every model in the same process. "
        f"Wall-clock {report['wall_s']:.0f} s.",
        "",
        "## Recipe",
        "",
        header,
        rule,
    ]
    lines += [_md_row(row, batches, metric) for row in [report["teacher"], *report["recipe"]]]
    for sweep, rows in report["sweeps"].items():
        lines += [
            "",
            f"## Sweep: {sweep}",
            "",
            header,
            rule,
            *[_md_row(row, batches, metric) for row in rows],
        ]
    if metric == "accuracy":
        lines += ["", "![accuracy vs sparsity](accuracy_vs_sparsity.png)"]
    lines += ["", f"![{name} vs size and latency]({_tradeoff_plot(metric)})", ""]
    return "\n".join(lines)


def _md_row(row: dict[str, Any], batches: list[str], metric: str) -> str:
    vs = row["vs_teacher"]
    timing = " | ".join(f"{row['latency_ms'][b]:.2f} | {vs['speedup'][b]:.2f}x" for b in batches)
    details = ", ".join(f"{k}={v}" for k, v in row["details"].items() if k != "widths")
    quality = (
        f"{row['accuracy']:.4f} | {vs['accuracy_drop_points']:.2f}"
        if metric == "accuracy"
        else f"{row[metric]:.3f} | {vs[f'{metric}_increase']:+.3f}"
    )
    return (
        f"| {row['name']} | {row['step']} | {quality} | "
        f"{row['parameters']:,} | {row['bytes']:,} | {vs['smaller']:.1f}x | {timing} | {details} |"
    )


def _plot_sparsity(report: dict[str, Any], path: str) -> None:
    figure, axis = pyplot().subplots(figsize=(6, 4))
    teacher = report["teacher"]["accuracy"]
    for name, rows in report["sweeps"].items():
        points = [
            (row["details"]["sparsity"], row["accuracy"]) for row in rows if "sparsity" in row["details"]
        ]
        if points:
            axis.plot(*zip(*sorted(points)), marker="o", label=name)
    axis.axhline(teacher, color="gray", linestyle="--", label="teacher")
    axis.set(
        xlabel="sparsity (share of weights / channels removed)",
        ylabel="test accuracy",
        title="Accuracy vs sparsity (after fine-tuning)",
    )
    axis.legend(loc="best")  # named: matplotlib warns on the console when a defaulted "best" takes over 1 s
    _save_figure(figure, path)


def _plot_tradeoffs(report: dict[str, Any], path: str) -> None:
    rows = [
        report["teacher"],
        *report["recipe"],
        *[row for rows in report["sweeps"].values() for row in rows],
    ]
    batch, metric = list(report["teacher"]["latency_ms"])[-1], report["metric"]
    figure, axes = pyplot().subplots(1, 2, figsize=(12, 5))
    for axis, key, label in (
        (axes[0], "bytes", "bytes on disk"),
        (axes[1], "latency", f"CPU latency at batch {batch} (ms)"),
    ):
        for row in rows:
            x = row["bytes"] if key == "bytes" else row["latency_ms"][batch]
            axis.scatter(x, row[metric], s=20)
            axis.annotate(row["name"], (x, row[metric]), fontsize=6)
        axis.set(xscale="log", xlabel=label, ylabel=_LABELS[metric][2])
    figure.suptitle("Every model of the run against the teacher")
    _save_figure(figure, path)


def _save_figure(figure, path: str) -> None:
    figure.tight_layout()
    write_atomic(path, lambda out: figure.savefig(out, format="png", dpi=120))
    pyplot().close(figure)
