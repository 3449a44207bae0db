"""A job's own progress on its console: lines from Ray workers, and bars for long steps.

Worker output does not reach the driver (see :mod:`scaleforge.runtime`), so a worker that has
something for the user (an epoch's metrics, the memory each rank holds) sends it through a
:class:`ProgressChannel`, a Ray queue that the driver drains and prints while it waits.
"""

import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Optional, TypeVar

import ray
from ray.util.queue import Empty, Queue

T = TypeVar("T")


class ProgressChannel:
    """Lines from workers to the driver's console. Get it on the driver (:meth:`shared`), pass it to
    the workers (it pickles as a handle), and wrap the wait in :meth:`printing`."""

    _shared: Optional["ProgressChannel"] = None

    def __init__(self):
        self.queue = Queue(actor_options={"num_cpus": 0})
        self.job = ray.get_runtime_context().get_job_id()

    @classmethod
    def shared(cls) -> "ProgressChannel":
        """One channel per driver and Ray session: its queue actor starts once, not once per run
        (a process start costs seconds on a small machine)."""
        if cls._shared is None or cls._shared.job != ray.get_runtime_context().get_job_id():
            cls._shared = cls()
        return cls._shared

    def send(self, line: str, wait: bool = False) -> None:
        """From a worker: print ``line`` on the driver's console (``wait``: until it is queued, e.g.
        before the process exits)."""
        sent = self.queue.actor.put_nowait.remote(line)
        if wait:
            ray.get(sent)

    @contextmanager
    def printing(self, stream=None) -> Iterator[None]:
        """Print every line sent while the ``with`` block runs, and whatever is left when it ends."""
        stream = stream or sys.stdout
        done = threading.Event()

        def drain(timeout: float) -> None:
            try:
                print(self.queue.get(timeout=timeout), file=stream, flush=True)
            except Empty:
                pass

        def pump() -> None:
            while not done.is_set():
                drain(0.2)

        thread = threading.Thread(target=pump, name="progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            while not self.queue.empty():
                drain(0.0)


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
