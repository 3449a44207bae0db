"""`make bench` writes each benchmark's output into the README between its markers."""

import subprocess
import sys

from conftest import REPO
from bench.readme_tables import SECTION, update


def test_a_block_is_replaced_in_place_and_a_new_one_lands_in_the_benchmarks_section():
    readme = f"# x\n\n{SECTION}\n\n<!-- bench:moe -->\nold\n<!-- /bench:moe -->\n\n## Layout\n"
    once = update(readme, "moe", "ratio 0.31", "2026-11-29")
    assert "old" not in once and "ratio 0.31" in once and once.count("<!-- bench:moe -->") == 1
    twice = update(once, "serving", "p50 12 ms\n\x1b[33m(raylet)\x1b[0m Task failed\n(ServeReplica:a:b pid=7) log", "2026-11-29")
    assert "p50 12 ms" in twice and "raylet" not in twice and "pid=7" not in twice  # Ray's log lines are not results
    assert twice.index("<!-- bench:serving -->") < twice.index("## Layout") and "ratio 0.31" in twice


def test_the_script_rewrites_a_readme_from_results_files(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "paramserver.txt").write_text("ours 4.1x\n")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n")
    out = subprocess.run([sys.executable, str(REPO / "bench/readme_tables.py"), str(readme), str(tmp_path / "results")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert SECTION in readme.read_text() and "ours 4.1x" in readme.read_text()
