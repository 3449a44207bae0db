"""Put each benchmark's latest output into docs/results.md, between its markers.

    python bench/results_tables.py docs/results.md bench/results README.md     # the last step of `make bench`

For every ``bench/results/<name>.txt`` (what ``make bench`` captured from ``bench/<name>.py``)
the block between ``<!-- bench:<name> -->`` and ``<!-- /bench:<name> -->`` is replaced with that
output, the date it was measured (the file's) and the command; a benchmark without a block yet
gets one at the end of the page. Every benchmark's first line names the commit it ran on and whether
the tree was clean (``bench/provenance.py``); the line moves into the table's stamp, and a table whose output
has none says so there. Text outside the markers is kept as it is. The page is replaced
atomically, so a reader never sees half of it.

Any further page (the README) may quote one row of a benchmark's output inline, between
``<!-- bench-row:<name>:<start of the row> -->`` and ``<!-- /bench-row -->``: the row of
``<name>.txt`` that starts so replaces what is between them, so that no measured number is typed by hand;
or a benchmark's whole output, in a block of its own (there, a block is replaced, never added).
"""

import datetime
import re
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "platform")]

from scaleforge.storage import write_atomic  # noqa: E402

HEADER = (
    "# Benchmark results\n\n"
    "Written by `make bench` (`bench/results_tables.py`); do not edit between the markers.\n"
)
"""The start of a results page that does not exist yet."""

# Ray's own log lines that reach a driver's stdout ("(raylet) ...", "(ServeReplica:... pid=1) ..."),
# possibly colour-coded: messages about the run, not its results.
RAY_LOG_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?\((raylet|[^)\s]*\s?pid=\d+)[^)]*\)")
PROVENANCE = re.compile(
    r"^commit (\w+)( \(not a git checkout\))?, (clean tree|tree not clean|tree state unknown)"
)
"""The line ``bench/provenance.py`` prints first: the commit a benchmark ran on, and whether the tree was
clean."""
STAMP = re.compile(r"^`python bench/[\w-]+\.py`, \d{4}-\d\d-\d\d, commit \w+")
"""A table's stamp line when it names the commit it ran on."""
NO_PROVENANCE = "no provenance line: the commit it ran on is unknown"


def block(name: str, output: str, when: str) -> str:
    """One benchmark's table between its markers, stamped with the command, the date it ran and the
    commit it ran on (its provenance line, moved from the output into the stamp)."""
    lines = [line for line in output.strip().splitlines() if not RAY_LOG_LINE.match(line)]
    stamps = [line for line in lines if PROVENANCE.match(line)]
    table = "\n".join(line for line in lines if not PROVENANCE.match(line))
    commit = f", {stamps[0]}" if stamps else f" ({NO_PROVENANCE})"
    return (
        f"<!-- bench:{name} -->\n`python bench/{name}.py`, {when}{commit}:\n\n```\n{table}\n```\n"
        f"<!-- /bench:{name} -->"
    )


def update(page: str, name: str, output: str, when: str) -> str:
    """``page`` with the block of benchmark ``name`` replaced in place, or added at the end."""
    fresh = block(name, output, when)
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.DOTALL)
    if pattern.search(page):
        return pattern.sub(lambda _: fresh, page)
    return page.rstrip("\n") + f"\n\n{fresh}\n"


QUOTE = re.compile(r"(<!-- bench-row:(?P<name>[\w-]+):(?P<start>.+?) -->).*?(<!-- /bench-row -->)", re.DOTALL)


def quote(page: str, outputs: dict[str, str]) -> str:
    """``page`` with each quoted row replaced by the row of its benchmark's output that starts so
    (kept as it is where that benchmark has no output or no such row)."""

    def row(match: re.Match) -> str:
        lines = [
            re.sub(r"\s{2,}", "  ", line.strip())
            for line in outputs.get(match["name"], "").splitlines()
            if line.strip().startswith(match["start"])
        ]
        return f"{match[1]}`{lines[-1]}`{match[4]}" if lines else match[0]

    return QUOTE.sub(row, page)


def measured_on(result: Path) -> str:
    """The date a benchmark's output was written (its file's)."""
    return datetime.date.fromtimestamp(result.stat().st_mtime).isoformat()


def main(page_path: str, results_dir: str, *quoting: str) -> None:
    """Rewrite the results page from every ``<name>.txt`` in ``results_dir``, and the rows that the
    ``quoting`` pages quote."""
    page = Path(page_path)
    text = page.read_text() if page.is_file() else HEADER
    results = sorted(Path(results_dir).glob("*.txt"))
    for result in results:
        text = update(text, result.stem, result.read_text(), measured_on(result))
    write_atomic(page, text)
    print(f"{page}: {len(results)} benchmark tables updated")
    outputs = {result.stem: result.read_text() for result in results}
    for other in map(Path, quoting):
        quoted = quote(other.read_text(), outputs)
        for result in results:
            if f"<!-- bench:{result.stem} -->" in quoted:
                quoted = update(quoted, result.stem, outputs[result.stem], measured_on(result))
        write_atomic(other, quoted)


if __name__ == "__main__":
    main(*sys.argv[1:])
