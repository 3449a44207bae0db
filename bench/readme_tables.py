"""Put each benchmark's latest output into the README, between its markers.

    python bench/readme_tables.py README.md bench/results

For every ``bench/results/<name>.txt`` (what ``make bench`` captured from ``bench/<name>.py``)
the block between ``<!-- bench:<name> -->`` and ``<!-- /bench:<name> -->`` is replaced with that
output, the date it was measured (the file's) and the command; a benchmark without markers yet
gets a new block at the end of the "Benchmarks" section. The README is replaced atomically.
"""

import datetime
import os
import re
import sys
import tempfile
from pathlib import Path

SECTION = "## Benchmarks (`make bench`)"


# Ray's own log lines that reach a driver's stdout ("(raylet) ...", "(ServeReplica:... pid=1) ..."),
# possibly colour-coded: messages about the run, not its results.
RAY_LOG_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?\((raylet|[^)\s]*\s?pid=\d+)[^)]*\)")


def block(name: str, output: str, when: str) -> str:
    table = "\n".join(line for line in output.strip().splitlines() if not RAY_LOG_LINE.match(line))
    return (f"<!-- bench:{name} -->\n`python bench/{name}.py`, {when}:\n\n```\n{table}\n```\n"
            f"<!-- /bench:{name} -->")


def update(readme: str, name: str, output: str, when: str) -> str:
    fresh = block(name, output, when)
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.DOTALL)
    if pattern.search(readme):
        return pattern.sub(lambda _: fresh, readme)
    if SECTION not in readme:
        return readme.rstrip("\n") + f"\n\n{SECTION}\n\n{fresh}\n"
    start = readme.index(SECTION) + len(SECTION)
    following = readme.find("\n## ", start)
    end = len(readme) if following < 0 else following
    return readme[:end].rstrip("\n") + f"\n\n{fresh}\n" + readme[end:]


def main(readme_path: str, results_dir: str) -> None:
    readme = Path(readme_path)
    text = readme.read_text()
    for result in sorted(Path(results_dir).glob("*.txt")):  # dated by when it was measured
        when = datetime.date.fromtimestamp(result.stat().st_mtime).isoformat()
        text = update(text, result.stem, result.read_text(), when)
    fd, tmp = tempfile.mkstemp(dir=readme.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, readme)
    print(f"{readme}: {len(list(Path(results_dir).glob('*.txt')))} benchmark tables updated")


if __name__ == "__main__":
    main(*sys.argv[1:3])
