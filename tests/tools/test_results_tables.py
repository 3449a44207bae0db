"""`make bench` writes each benchmark's output into docs/results.md between its markers."""

import subprocess
import sys

from conftest import REPO

from bench.results_tables import HEADER, quote, update


def test_a_block_is_replaced_in_place_and_a_new_one_is_added_at_the_end():
    page = "# Results\n\nhow to read\n\n<!-- bench:moe -->\nold\n<!-- /bench:moe -->\n\nnotes after moe\n"
    once = update(page, "moe", "commit 1a2b3c4, clean tree\nratio 0.31", "2026-11-29")
    assert "old" not in once and "ratio 0.31" in once and once.count("<!-- bench:moe -->") == 1
    assert (
        "how to read" in once
        and "notes after moe" in once
        and "`python bench/moe.py`, 2026-11-29, commit 1a2b3c4, clean tree:" in once
    )
    twice = update(
        once,
        "serving",
        "p50 12 ms\n\x1b[33m(raylet)\x1b[0m Task failed\n(ServeReplica:a:b pid=7) log",
        "2026-11-29",
    )
    assert (
        "p50 12 ms" in twice and "raylet" not in twice and "pid=7" not in twice
    )  # Ray's log lines are not results
    assert twice.index("notes after moe") < twice.index("<!-- bench:serving -->") and "ratio 0.31" in twice
    assert twice.endswith("<!-- /bench:serving -->\n")


def test_the_script_starts_a_missing_page_and_keeps_the_text_around_the_blocks(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "paramserver.txt").write_text("ours 4.1x\n")
    page = tmp_path / "docs" / "results.md"
    command = [sys.executable, str(REPO / "bench/results_tables.py"), str(page), str(tmp_path / "results")]
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert page.read_text().startswith(HEADER) and "ours 4.1x" in page.read_text()
    page.write_text(page.read_text().replace(HEADER, "# Results\n\nhand-written intro\n"))
    (tmp_path / "results" / "paramserver.txt").write_text("ours 4.4x\n")
    assert subprocess.run(command, capture_output=True, text=True).returncode == 0
    text = page.read_text()
    assert "hand-written intro" in text and "ours 4.4x" in text and "4.1x" not in text
    assert [p.name for p in page.parent.iterdir()] == ["results.md"]  # no temporary file left behind


def test_the_results_page_has_a_table_for_every_benchmark_that_make_bench_runs():
    makefile = (REPO / "Makefile").read_text()
    benches = (
        next(line for line in makefile.splitlines() if line.startswith("BENCHES ?=")).split("=", 1)[1].split()
    )
    page = (REPO / "docs/results.md").read_text()
    scripts = sorted(
        p.stem
        for p in (REPO / "bench").glob("*.py")
        if p.stem not in ("results_tables", "bars", "provenance", "jobs_here")
    )  # helpers; the peers and each bench's parts are in folders of their own
    assert sorted(benches) == scripts, f"make bench runs {benches}, bench/ holds {scripts}"
    for name in benches:
        assert f"<!-- bench:{name} -->" in page and f"<!-- /bench:{name} -->" in page, name


def test_a_page_quotes_one_row_of_a_benchmarks_output():
    page = (
        "Push: <!-- bench-row:paramserver:a. push + pull -->`old`<!-- /bench-row --> and "
        "<!-- bench-row:moe:ratio -->`kept`<!-- /bench-row -->."
    )
    output = "a. push + pull table header\nx\n  a. push + pull, 10M: ours / docs   2.6x-3.1x   >= 2.5x yes\n"
    quoted = quote(page, {"paramserver": output})
    assert (
        "`a. push + pull, 10M: ours / docs  2.6x-3.1x  >= 2.5x yes`" in quoted
    )  # columns: two spaces and "old" not in quoted
    assert "`kept`" in quoted  # no output of that benchmark: left as it is
    assert quote(quoted, {"paramserver": output}) == quoted


def test_a_quoting_page_gets_a_whole_block_replaced_but_never_one_added(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "demo.txt").write_text("cascade 3,848\n")
    (tmp_path / "results" / "moe.txt").write_text("ratio 0.31\n")
    readme = tmp_path / "README.md"
    readme.write_text("# front page\n\n<!-- bench:demo -->\nold table\n<!-- /bench:demo -->\n\nlayout\n")
    command = [
        sys.executable,
        str(REPO / "bench/results_tables.py"),
        str(tmp_path / "results.md"),
        str(tmp_path / "results"),
        str(readme),
    ]
    assert subprocess.run(command, capture_output=True, text=True).returncode == 0
    text = readme.read_text()
    assert "cascade 3,848" in text and "old table" not in text and "ratio 0.31" not in text
    assert text.startswith("# front page\n") and text.endswith("\n\nlayout\n")
