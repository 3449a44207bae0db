"""The console of a job: worker lines reach it through the progress channel (losing its queue never
fails a job), and Ray's own INFO lines do not."""

import io
import os
import subprocess
import sys
import time

import ray
from conftest import REPO

from scaleforge.progress import ProgressChannel


@ray.remote(num_cpus=0)
def _report(channel: ProgressChannel, lines: list[str]) -> None:
    for line in lines:
        channel.send(line)
    channel.send("last", wait=True)


def test_lines_from_a_worker_are_printed_and_a_lost_queue_is_replaced(ray_cluster):
    channel = ProgressChannel.shared()
    assert ProgressChannel.shared() is channel  # one queue actor per driver, not one per run
    console = io.StringIO()
    with channel.printing(console):
        ray.get(_report.remote(channel, ["epoch 1/2", "epoch 2/2"]))
    assert console.getvalue().splitlines() == ["epoch 1/2", "epoch 2/2", "last"]
    ray.kill(channel.lines)
    # ray.kill is asynchronous: on a loaded machine the actor can still answer a moment after it; each
    # block here sees lines dropped and its wait go on until the channel notices the loss.
    deadline = time.monotonic() + 30
    while channel.alive and time.monotonic() < deadline:
        with channel.printing(io.StringIO()):
            ray.get(_report.remote(channel, ["lost"]))
    assert not channel.alive and ProgressChannel.shared() is not channel


_RAY_DATA_AFTER_QUIETING = """
import logging
from scaleforge.runtime import quiet_ray_loggers
quiet_ray_loggers()
import ray.data  # as a stage imports it: after the job connected to Ray and quieted its loggers
log = logging.getLogger("ray.data")
log.info("Dataset execution finished")
log.warning("Progress bars disabled")
log.error("a failed read")
"""


def test_ray_data_imported_after_the_console_is_quieted_prints_only_errors():
    env = {k: v for k, v in os.environ.items() if k != "RAY_DATA_LOG_LEVEL"}
    out = subprocess.run(
        [sys.executable, "-c", _RAY_DATA_AFTER_QUIETING],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "a failed read" in out.stderr + out.stdout
    assert "finished" not in out.stderr + out.stdout and "Progress bars" not in out.stderr + out.stdout
