"""Every benchmark names the code it measured, and refuses to measure code a Ray worker would import from
another tree (``bench/provenance.py``)."""

import ast
import os
import subprocess
import sys

from conftest import REPO

from bench.results_tables import NO_PROVENANCE, PROVENANCE, block

DRIVER = (
    "import sys\n"
    f"sys.path.insert(0, {str(REPO / 'bench')!r})\n"
    "from provenance import check_and_print\n"
    "check_and_print()\n"
)
"""A benchmark driver's first step, as a script of its own (Ray adds a script's folder to workers' paths)."""


def _drive(tmp_path, cwd, pythonpath=None) -> subprocess.CompletedProcess:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_driver_started_in_this_tree_prints_the_commit_it_measures(tmp_path):
    run = _drive(tmp_path, REPO)
    assert run.returncode == 0, run.stderr
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    line = run.stdout.splitlines()[0]
    assert PROVENANCE.match(line) and line.startswith(f"commit {head}, "), line


def test_a_package_on_pythonpath_from_another_tree_stops_the_benchmark_with_exit_2(tmp_path):
    other = tmp_path / "other-checkout"
    (other / "scaleforge").mkdir(parents=True)
    (other / "scaleforge" / "__init__.py").write_text("")
    run = _drive(tmp_path, REPO, pythonpath=str(other))
    assert run.returncode == 2 and run.stdout == ""
    assert "refusing to run: Ray workers would not import this checkout's packages" in run.stderr
    assert f"scaleforge: {other / 'scaleforge' / '__init__.py'}" in run.stderr
    assert f"PYTHONPATH={other}" in run.stderr
    assert "serving:" not in run.stderr and "jobs:" not in run.stderr  # only the package that moved


def test_a_package_on_pythonpath_that_the_working_directory_shadows_does_not_matter(tmp_path):
    """Ray puts the driver's working directory before PYTHONPATH on a worker's path: started in this
    tree, a worker imports this tree's ``jobs`` whatever PYTHONPATH holds."""
    other = tmp_path / "other-checkout"
    (other / "jobs").mkdir(parents=True)
    (other / "jobs" / "__init__.py").write_text("")
    run = _drive(tmp_path, REPO, pythonpath=str(other))
    assert run.returncode == 0, run.stderr


def test_a_driver_started_from_the_bench_folder_is_refused(tmp_path):
    """From ``bench/``, a worker's ``serving`` would be ``bench/serving.py``, inside the tree but not the
    Serve apps, and ``jobs`` not importable at all."""
    run = _drive(tmp_path, REPO / "bench")
    assert run.returncode == 2
    assert f"serving: {REPO / 'bench' / 'serving.py'} (expected from {REPO / 'serving'})" in run.stderr
    assert f"jobs: not importable (expected from {REPO / 'jobs'})" in run.stderr


def _git(repo, *args) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, cwd=repo, capture_output=True, text=True, check=True).stdout


def test_the_tree_state_says_clean_only_when_nothing_but_bench_results_changed(tmp_path):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from provenance import tree_state
    finally:
        sys.path.remove(str(REPO / "bench"))
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    _git(tmp_path, "add", "code.py")
    _git(tmp_path, "commit", "-q", "-m", "code")
    head = _git(tmp_path, "rev-parse", "--short", "HEAD").strip()
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "demo.out").write_text("a run's output\n")  # make bench's own
    assert tree_state(tmp_path) == f"commit {head}, clean tree"
    (tmp_path / "code.py").write_text("x = 2\n")
    (tmp_path / "new.py").write_text("")
    assert tree_state(tmp_path) == f"commit {head}, tree not clean (uncommitted: code.py, new.py)"
    assert PROVENANCE.match(tree_state(tmp_path))
    outside = tmp_path.parent / f"{tmp_path.name}-no-git"
    outside.mkdir()
    assert PROVENANCE.match(tree_state(outside))


def test_a_table_without_a_provenance_line_says_so_in_its_heading():
    named = block("moe", "commit 1a2b3c4, clean tree\nratio 0.31\n", "2026-12-05")
    assert "`python bench/moe.py`, 2026-12-05, commit 1a2b3c4, clean tree:" in named
    assert "```\nratio 0.31\n```" in named  # the line is in the stamp, not the table
    unnamed = block("moe", "ratio 0.31\n", "2026-12-05")
    assert f"`python bench/moe.py`, 2026-12-05 ({NO_PROVENANCE}):" in unnamed


def test_every_benchmark_checks_its_tree_first():
    helpers = ("results_tables", "bars", "provenance", "jobs_here")
    for script in (p for p in (REPO / "bench").glob("*.py") if p.stem not in helpers):
        main = next(
            node
            for node in ast.parse(script.read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name == "main"
        )
        body = main.body[1:] if ast.get_docstring(main) else main.body
        assert ast.unparse(body[0]) == "check_and_print()", f"{script.name}: main() starts otherwise"
