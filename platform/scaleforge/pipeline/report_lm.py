"""The report stage of the main job on text: a final table, ``report.md`` with sample completions, and
plots (draft lengths, tokens/s per load, the compression trade-off).

Like the classifier's, it reads the records of the stages before it and nothing else.
"""

from scaleforge.compress.report import slim_sentence
from scaleforge.pipeline.records_lm import LMRecords
from scaleforge.pipeline.report import ReportStage, new_figure, save_figure, write_markdown
from scaleforge.storage import join, read_bytes, write_atomic

PLOTS = {
    "draft_lengths.png": "Draft length: tokens/s and acceptance of each candidate",
    "tokens_per_s.png": "Generated tokens/s of each served generator, per load",
    "compression_bits_per_byte_vs_size.png": "Compression: bits/byte against size and latency",
}


class LMReportStage(ReportStage):
    """``report/report.md`` and its plots in the output folder."""

    @staticmethod
    def write(records: LMRecords, folder: str) -> str:
        return write_report(records, folder)


def bits_per_byte(records: LMRecords) -> dict[str, float]:
    """Validation bits/byte by artifact, as the compression job scored every model on the same bytes."""
    report = records.compress.report.model_dump()
    rows = [
        report["teacher"],
        *report["recipe"],
        *(r for rows in report.get("sweeps", {}).values() for r in rows),
    ]
    scores = {str(row["artifact"]).rstrip("/"): row["bits_per_byte"] for row in rows if "artifact" in row}
    scores.setdefault(records.teacher.artifact.rstrip("/"), report["teacher"]["bits_per_byte"])
    # The recipe's slim model is its last step's, exported to the output's ``model`` folder.
    scores.setdefault(records.compress.artifact.rstrip("/"), report["recipe"][-1]["bits_per_byte"])
    return scores


def final_table(records: LMRecords) -> str:
    """One row per served generator (its model's bits/byte, tokens/s per load, time to first token,
    acceptance, rows per decode step), then the draft length, the compressed model and the wall-clock."""
    query, scores = records.query, bits_per_byte(records)
    clients = [load.clients for load in next(iter(query.generators.values())).loads]
    loads = "".join(f" {f'tok/s @{c}':>10s}" for c in clients)
    lines = [
        f"{'generator':16s} {'model':13s} {'bits/byte':>9s}{loads} {'TTFT ms':>8s} {'accept':>6s} "
        f"{f'rows/step @{clients[-1]}':>13s}"
    ]
    for name, row in query.generators.items():
        score = scores.get(row.artifact.rstrip("/"))
        first, last = row.loads[0], row.loads[-1]
        rows = "-" if last.rows_per_step is None else f"{last.rows_per_step:.1f} (max {last.largest_step})"
        lines.append(
            f"{name:16s} {row.model:13s} {'n/a' if score is None else f'{score:.3f}':>9s}"
            + "".join(f" {load.tokens_per_s:10,.0f}" for load in row.loads)
            + f" {first.first_token_p50_ms:8.1f}"
            + f" {'-' if first.acceptance is None else f'{first.acceptance:.2f}':>6s}"
            + f" {rows:>13s}"
        )
    lines.append(
        f"{query.max_tokens} new tokens per prompt of {query.prompt_bytes} bytes, greedy, streamed; "
        f"TTFT (time to first token p50) and acceptance at {clients[0]} client(s); "
        + ("at the ingress replicas' own ports (direct ingress)" if query.direct else "through Serve's proxy")
    )
    drafts = records.calibrate
    plain = next((p.tokens_per_s for p in drafts.points if p.draft_tokens == 0), None)
    best = next(p for p in drafts.points if p.draft_tokens == drafts.chosen)
    lines.append(
        f"draft length: {drafts.generator!r} ({drafts.model} drafted by {drafts.drafter}) draft_tokens "
        f"{drafts.chosen}, {best.tokens_per_s:,.0f} tokens/s at acceptance {best.acceptance:.2f}"
        + (f" against {plain:,.0f} undrafted" if plain and drafts.chosen else "")
        + f"; drafting up to {drafts.draft_max_running or 'any number of'} sequences"
    )
    lines.append(f"compressed model: {slim_sentence(records.compress.report.model_dump())}")
    trained = records.teacher.metrics.get("bits_per_byte")
    if trained is not None:
        lines.append(
            f"teacher: validation bits/byte {trained:.3f} after {records.teacher.wall_s:.0f} s of training"
        )
    lines.append(f"pipeline wall-clock: {query.pipeline_wall_s:.0f} s")
    return "\n".join(lines)


def write_report(records: LMRecords, folder: str) -> str:
    """``report.md`` and its plots in ``folder`` (a local folder or a URI); returns the markdown's
    location."""
    _draft_lengths(records, join(folder, "draft_lengths.png"))
    _tokens_per_s(records, join(folder, "tokens_per_s.png"))
    write_atomic(
        join(folder, "compression_bits_per_byte_vs_size.png"),
        read_bytes(join(records.compress.output, "bits_per_byte_vs_size_latency.png")),
    )
    samples = ["## Sample completions", ""]
    for sample in records.query.samples:
        samples += [
            f"Prompt {sample.prompt!r}:",
            "",
            "```python",
            sample.prompt + sample.completion,
            "```",
            "",
        ]
    title = "scaleforge pipeline report: the language model"
    return write_markdown(folder, title, final_table(records), samples, PLOTS)


def _draft_lengths(records: LMRecords, path: str) -> None:
    drafts = records.calibrate
    plt, figure, axis = new_figure()
    k = [p.draft_tokens for p in drafts.points]
    axis.plot(k, [p.tokens_per_s for p in drafts.points], marker="o", label="tokens/s")
    chosen = next(p for p in drafts.points if p.draft_tokens == drafts.chosen)
    axis.scatter([chosen.draft_tokens], [chosen.tokens_per_s], color="red", zorder=3, label="chosen")
    twin = axis.twinx()
    twin.plot(k, [p.acceptance for p in drafts.points], color="gray", linestyle="--", marker=".")
    twin.set_ylabel("acceptance (dashed)")
    axis.set(
        xlabel="draft tokens per check",
        ylabel="tokens/s, 1 request at a time",
        title=f"{drafts.generator}: {drafts.model} drafted by {drafts.drafter}",
    )
    save_figure(plt, figure, axis, path)


def _tokens_per_s(records: LMRecords, path: str) -> None:
    plt, figure, axis = new_figure()
    names = list(records.query.generators)
    clients = [load.clients for load in records.query.generators[names[0]].loads]
    width = 0.8 / len(clients)
    for i, count in enumerate(clients):
        values = [records.query.generators[n].loads[i].tokens_per_s for n in names]
        axis.bar([x + i * width for x in range(len(names))], values, width, label=f"{count} client(s)")
    axis.set_xticks([x + width * (len(clients) - 1) / 2 for x in range(len(names))], names, rotation=20)
    axis.set(ylabel="generated tokens/s", title="Served generators over HTTP, streaming, greedy")
    save_figure(plt, figure, axis, path)
