"""Where a benchmark's jobs run: a temporary folder, their progress on stderr."""

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path


@contextmanager
def job_folder(bench: str) -> Iterator[Path]:
    """A temporary folder for the jobs of benchmark ``bench``; while it is open the jobs' own progress
    lines go to stderr, so stdout carries the table alone (what ``make bench`` keeps)."""
    with (
        tempfile.TemporaryDirectory(prefix=f"scaleforge-bench-{bench}-") as folder,
        redirect_stdout(sys.stderr),
    ):
        yield Path(folder)
