"""What the benchmarks decide: met, missed or a tie, and no plain peer measured while Ray runs."""

import os
import subprocess
import sys

from conftest import REPO

from bench.bars import print_bars

# bench/lm.py's parts import each other as lm_parts.*. Last on the path: bench/serving.py must not shadow
# the serving package for a later test in this process that deploys an app.
sys.path.append(str(REPO / "bench"))

from lm_parts.machine import MARKER, mark_this_bench, ray_processes, wait_for_no_ray  # noqa: E402
from lm_parts.quality import versus  # noqa: E402


def test_a_tie_is_printed_as_such_and_is_no_miss(capsys):
    tie = ("bits/byte against plain", "1.650 vs 1.655", "<= plain beyond the spread", None)
    assert print_bars([("a", "1", "1", True), tie]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].endswith(" tie") and out[-1] == "every bar met (a tie: bits/byte against plain)"
    assert print_bars([("a", "0.8", ">= 0.9", False), tie]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("missed: a")  # what `make bench` looks for


def test_a_miss_computed_with_numpy_counts(capsys):
    import numpy as np

    measured = np.array([0.78, 0.84])
    assert print_bars([("ratio", "0.78", ">= 0.9", measured.min() >= 0.9)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "missed: ratio"


def test_lower_bits_win_only_beyond_the_larger_spread():
    assert versus([1.600, 1.610, 1.605], [1.650, 1.660, 1.655]) is True
    assert versus([1.650, 1.660, 1.655], [1.600, 1.610, 1.605]) is False
    # a gap of 0.003 (the old bar's margin) inside a plain spread of 0.032: a tie
    assert versus([1.676, 1.676, 1.676], [1.647, 1.679, 1.669]) is None


def test_the_ray_this_bench_started_is_found_and_waited_out(monkeypatch):
    monkeypatch.setenv(MARKER, f"test-{os.getpid()}")  # what mark_this_bench sets, undone afterwards
    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import ray, sys; ray.init(address='local', num_cpus=1, include_dashboard=False); "
            "print('up', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout.readline().strip() == "up"
        names = " ".join(ray_processes(only_this_bench=True))
        assert "raylet" in names and "gcs_server" in names, names
    finally:
        driver.communicate("", timeout=60)  # the driver exits; its embedded Ray goes with it
    wait_for_no_ray(only_this_bench=True, timeout_s=60)
    assert ray_processes(only_this_bench=True) == []


def test_a_parts_own_process_keeps_the_benchs_marker(monkeypatch):
    monkeypatch.setenv(MARKER, "12345")
    mark_this_bench()
    assert os.environ[MARKER] == "12345"
