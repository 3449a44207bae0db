"""The progress channel: worker lines reach the driver's console; losing its queue never fails a job."""

import io

import ray

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
    with channel.printing(io.StringIO()):  # lines are dropped, the wait goes on
        ray.get(_report.remote(channel, ["lost"]))
    assert not channel.alive and ProgressChannel.shared() is not channel
