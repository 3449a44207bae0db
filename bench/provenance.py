"""What every benchmark does first: refuse to measure another tree's code, then name the code it measures.

    from provenance import check_and_print
    check_and_print()      # the first line of main(): exit 2, or print "commit 1a2b3c4, clean tree"

A Ray worker does not run the driver's ``sys.path``: it imports ``scaleforge``, ``serving`` and ``jobs``
from the driver's working directory (Ray puts it, and the script's folder, first on every worker's
path), then ``PYTHONPATH``, then the editable install in the interpreter's site-packages (``make
install`` maps both packages to one checkout's folders). Any of these can name another checkout: a
``PYTHONPATH`` left over from other work, a virtual environment installed from another clone. The
driver itself would still import this tree (every bench puts it first on its own path), so the
numbers would mix two trees' code without a word. :func:`foreign_imports` asks a fresh process set up
as a worker would be where each package comes from.

The line printed names the commit (``git rev-parse --short HEAD``) and whether the tree was clean
(``git status --porcelain``, ``bench/results/`` aside: ``make bench`` writes there while it runs);
``bench/results_tables.py`` keeps it in every table it writes.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"scaleforge": "platform/scaleforge", "serving": "serving", "jobs": "jobs"}
"""The packages of this tree that Ray workers import (the library, the Serve apps, the job entry points)
and their folders in it. Inside the tree is not enough: ``bench/serving.py`` is a ``serving`` too, the
one a worker would import if the driver's working directory were ``bench/``."""
OWN_OUTPUT = "bench/results"
"""Where ``make bench`` writes while it runs: not a change to the code measured."""

_WHERE = """
import importlib.util, json, sys
sys.path[:0] = json.loads(sys.argv[1])
found = {}
for name in json.loads(sys.argv[2]):
    spec = importlib.util.find_spec(name)
    found[name] = None if spec is None else (spec.origin or list(spec.submodule_search_locations)[0])
print(json.dumps(found))
"""
"""Run in the worker-like process: where each package would be imported from (found, not imported)."""


def worker_imports(repo: Path = REPO, driver_cwd: str | None = None) -> dict[str, str | None]:
    """Where a Ray worker of a driver started here would import each of :data:`PACKAGES` from (None:
    not importable), asked of a fresh process of this interpreter with this environment
    (``PYTHONPATH`` included) started outside ``repo``, with the driver's working directory and
    script folder first on its path as Ray puts them."""
    script_dir = os.path.dirname(os.path.realpath(sys.argv[0])) if sys.argv and sys.argv[0] else None
    front = [os.path.abspath(driver_cwd or os.curdir)] + ([script_dir] if script_dir in sys.path else [])
    with tempfile.TemporaryDirectory(prefix="scaleforge-worker-cwd-") as elsewhere:
        found = subprocess.run(
            [sys.executable, "-c", _WHERE, json.dumps(front), json.dumps(list(PACKAGES))],
            cwd=elsewhere,
            env=os.environ.copy(),
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(found.stdout)


def foreign_imports(repo: Path = REPO, driver_cwd: str | None = None) -> list[str]:
    """One line per package that a Ray worker would not import from its folder in ``repo``: where it
    would instead."""
    lines = []
    for name, origin in worker_imports(repo, driver_cwd).items():
        folder = (repo / PACKAGES[name]).resolve()
        if origin is None:
            lines.append(f"{name}: not importable (expected from {folder})")
        elif not Path(origin).resolve().is_relative_to(folder):
            lines.append(f"{name}: {origin} (expected from {folder})")
    return lines


def tree_state(repo: Path = REPO) -> str:
    """``commit <short sha>, clean tree``, or ``..., tree not clean (uncommitted: <paths>)``; ``commit
    unknown`` outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "--short", "HEAD").strip()
        changed = git("status", "--porcelain", "--untracked-files=all", "--", ".", f":(exclude){OWN_OUTPUT}")
    except (OSError, subprocess.CalledProcessError):
        return "commit unknown (not a git checkout), tree state unknown"
    paths = [line[3:] for line in changed.splitlines() if line.strip()]
    if not paths:
        return f"commit {commit}, clean tree"
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    return f"commit {commit}, tree not clean (uncommitted: {shown})"


def check_and_print(repo: Path = REPO) -> None:
    """Exit 2 where Ray workers would import code from anywhere but ``repo``; else print the
    provenance line (the first line of a benchmark's output)."""
    foreign = foreign_imports(repo)
    if foreign:
        where = os.environ.get("PYTHONPATH")
        sys.stderr.write(
            f"{Path(sys.argv[0]).name}: refusing to run: Ray workers would not import this checkout's "
            f"packages ({repo}):\n"
            + "".join(f"  {line}\n" for line in foreign)
            + (f"PYTHONPATH={where}\n" if where else "")
            + f"Run it from {repo} (the working directory is on every worker's path) with that "
            "checkout's .venv (`make install` there) and no PYTHONPATH naming another tree.\n"
        )
        sys.exit(2)
    print(tree_state(repo), flush=True)
