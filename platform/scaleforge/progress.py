"""A job's own progress on its console: lines from Ray workers, and bars for long steps.

Worker output does not reach the driver (see :mod:`scaleforge.runtime`), so a worker that has
something for the user (an epoch's metrics, the memory each rank holds) sends it through a
:class:`ProgressChannel`, a Ray actor that the driver drains and prints while it waits.
"""

import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Optional, TypeVar

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

T = TypeVar("T")


@ray.remote(num_cpus=0)
class _Lines:
    """The lines sent and not yet printed. A plain (not async) actor runs one caller's calls in the
    order sent; ``ray.util.queue.Queue`` (an asyncio actor) reordered lines sent without waiting and,
    when a blocking ``get`` timed out as a line arrived, lost it."""

    def __init__(self):
        self.lines: list[str] = []
        self.records: list[dict] = []

    def put(self, line: str) -> None:
        self.lines.append(line)

    def put_record(self, record: dict) -> None:
        self.records.append(record)

    def take(self) -> tuple[list[str], list[dict]]:
        taken, self.lines, self.records = (self.lines, self.records), [], []
        return taken


class ProgressChannel:
    """Lines from workers to the driver's console. Get it on the driver (:meth:`shared`), pass it to
    the workers (it pickles as a handle), and wrap the wait in :meth:`printing`.

    Progress is best effort: the lines wait on the driver's node (a lost worker node cannot take
    them along), and should that actor die anyway, lines are dropped and the job goes on."""

    _shared: Optional["ProgressChannel"] = None

    def __init__(self):
        context = ray.get_runtime_context()
        here = NodeAffinitySchedulingStrategy(node_id=context.get_node_id(), soft=True)
        self.lines = _Lines.options(scheduling_strategy=here).remote()
        self.job = context.get_job_id()
        self.alive = True
        self.records: list[dict] = []
        """What workers sent with :meth:`record` during the last :meth:`printing` block, in order."""

    @classmethod
    def shared(cls) -> "ProgressChannel":
        """One channel per driver and Ray session: its actor starts once, not once per run (a
        process start costs seconds on a small machine)."""
        shared = cls._shared
        if shared is None or not shared.alive or shared.job != ray.get_runtime_context().get_job_id():
            cls._shared = cls()
        return cls._shared

    def send(self, line: str, wait: bool = False) -> None:
        """From a worker: print ``line`` on the driver's console (``wait``: until it is held, e.g.
        before the process exits)."""
        sent = self.lines.put.remote(line)
        if wait:
            try:
                ray.get(sent)
            except RayActorError:  # gone with the driver's node, and the console with it
                pass

    def __getstate__(self) -> dict:
        """What a worker gets: the actor's handle, not the records the driver holds."""
        return {**self.__dict__, "records": []}

    def record(self, entry: dict) -> None:
        """From a worker: a structured entry (one training step) for the driver's :attr:`records`,
        delivered in order with the lines this worker sends."""
        self.lines.put_record.remote(entry)

    @contextmanager
    def printing(self, stream=None, every_s: float = 0.2) -> Iterator[None]:
        """Print every line sent while the ``with`` block runs, and whatever is left when it ends;
        collect the records in :attr:`records`."""
        stream = stream or sys.stdout
        done = threading.Event()
        self.records = []

        def drain() -> None:
            try:
                lines, records = ray.get(self.lines.take.remote())
            except RayActorError:
                self.alive = False
                return
            self.records.extend(records)
            for line in lines:
                print(line, file=stream, flush=True)

        def pump() -> None:
            while self.alive and not done.wait(every_s):
                drain()

        thread = threading.Thread(target=pump, name="progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            if self.alive:
                drain()


def bar(items: Iterable[T], total: Optional[int], label: str) -> Iterator[T]:
    """``items``, with a progress bar on an interactive console (rich); on a pipe or log file only
    the label and a final count, so logs stay readable."""
    if not sys.stdout.isatty():
        count = 0
        for item in items:
            count += 1
            yield item
        print(f"{label}: {count}/{total if total is not None else count} done", flush=True)
        return
    from rich.progress import track

    yield from track(items, total=total, description=label, transient=True)
