"""Closed-loop HTTP load: clients that each send their next request as soon as the last is answered.

One driver for every measurement of a served endpoint: the pipeline's query stage
(:mod:`scaleforge.pipeline.query`) and the serving benchmarks (``bench/serving.py``). The caller
makes the requests (:func:`infer_request` for a V2 JSON body) and says what to keep of each answer.
"""

import itertools
import json
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Generic, Optional, TypeVar

import httpx
import numpy as np

from scaleforge.progress import bar

T = TypeVar("T")

RETRIED = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
"""Transport failures after which an inference request is sent again. Inference is idempotent, and a
connection can be cut with no fault of the model's: Serve drains and stops the proxy of a node that
holds no replica, and where proxies share a port (nodes on one machine, ``SO_REUSEPORT``) the
connections queued at the stopped one are reset ('Connection reset by peer')."""
ATTEMPTS = 4
JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Request:
    """One request of a load: POSTed to ``path`` under a client's base URL."""

    path: str
    body: bytes
    headers: dict[str, str]
    label: str = ""
    """Names the request in the line printed when it is sent again."""


@dataclass(frozen=True)
class Answer(Generic[T]):
    """One answered request: its ticket (the order it was sent in), the request's index, the latency
    the client saw (retries included), the status (0: no HTTP answer), what ``read`` kept of the
    response and when it came (``time.time()``)."""

    ticket: int
    request: int
    latency_s: float
    status: int
    value: Optional[T]
    at: float


@dataclass(frozen=True)
class Load(Generic[T]):
    """Every answer, in the order they came back, and the seconds from the start to the last one."""

    answers: list[Answer[T]]
    seconds: float


def infer_request(path: str, rows: np.ndarray, parameters: dict, label: str = "") -> Request:
    """A V2 JSON infer request of ``rows`` (FP32), encoded as ``httpx``'s ``json=`` encodes it."""
    body = {
        "inputs": [
            {"name": "input", "shape": list(rows.shape), "datatype": "FP32", "data": rows.ravel().tolist()}
        ],
        "parameters": parameters,
    }
    encoded = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    return Request(path, encoded, JSON, label)


def closed_loop(
    urls: Sequence[str],
    requests: Sequence[Request],
    read: Callable[[int, httpx.Response], T],
    clients: int,
    seconds: float = 0.0,
    *,
    at_least: int = 0,
    warmup: bool = False,
    attempts: int = ATTEMPTS,
    timeout_s: float = 120.0,
    record_errors: bool = False,
    stop: Optional[threading.Event] = None,
    progress: Optional[str] = None,
) -> Load[T]:
    """Drive ``clients`` closed-loop clients over ``requests`` (in turn, from the first, again and
    again) until ``seconds`` have passed and at least ``at_least`` requests were sent, or ``stop`` is set.

    Args:
        urls: base URLs; client i sends to ``urls[i % len(urls)]`` (one URL per replica spreads the
            clients as a load balancer does).
        read: ``read(ticket, response)``, called in the client right after the latency is taken; what
            it returns is the answer's ``value`` (an exception it raises ends the load, raised here).
        warmup: each client first sends one request that is not counted; the clock starts once all
            are answered.
        attempts: sends of a request whose connection failed before an answer (1: no retry).
        record_errors: a request with no HTTP answer after its last attempt (``httpx.HTTPError``, a
            timeout too) is an answer of status 0 instead of an error that ends the load.
        progress: a label for a progress bar over the answers.
    """
    tickets = _Tickets(seconds, at_least, stop or threading.Event())
    send = partial(_send, requests=requests, read=read, attempts=attempts, record_errors=record_errors)
    started = threading.Barrier(clients, action=tickets.start)

    def client(index: int, answered: Callable[[Optional[Answer]], None]) -> None:
        try:
            with httpx.Client(base_url=urls[index % len(urls)], timeout=timeout_s) as http:
                if warmup:
                    request = requests[index % len(requests)]
                    http.post(request.path, content=request.body, headers=request.headers)
                started.wait()
                while (ticket := tickets.next()) is not None:
                    answered(send(http, ticket))
        except BaseException:
            started.abort()  # the other clients stop waiting for this one
            raise
        finally:
            answered(None)

    answers = _run_clients(client, clients, progress, None if seconds else len(requests))
    return Load(answers, time.perf_counter() - (tickets.began or time.perf_counter()))


class _Tickets:
    """The clients' tickets, drawn in order under a lock (so the requests sent are tickets 0 to n - 1),
    from :meth:`start` until at least ``at_least`` were drawn and ``seconds`` have passed, or ``stop``
    is set."""

    def __init__(self, seconds: float, at_least: int, stop: threading.Event):
        self.count, self.lock = itertools.count(), threading.Lock()
        self.seconds, self.at_least, self.stop = seconds, at_least, stop
        self.began: Optional[float] = None

    def start(self) -> None:
        self.began = time.perf_counter()

    def next(self) -> Optional[int]:
        """The next ticket, or None once the load is over."""
        if self.stop.is_set():
            return None
        with self.lock:
            ticket = next(self.count)
            if ticket >= self.at_least and time.perf_counter() >= self.began + self.seconds:
                return None
            return ticket


def _send(
    http: httpx.Client, ticket: int, requests: Sequence[Request], read, attempts: int, record_errors: bool
) -> Answer:
    index = ticket % len(requests)
    request = requests[index]
    began = time.perf_counter()
    try:
        response = post_idempotent(http, request.path, request.body, request.label, request.headers, attempts)
    except httpx.HTTPError:
        if not record_errors:
            raise
        return Answer(ticket, index, time.perf_counter() - began, 0, None, time.time())
    latency = time.perf_counter() - began  # the latency a client sees, retries included
    return Answer(ticket, index, latency, response.status_code, read(ticket, response), time.time())


def _run_clients(client, clients: int, progress: Optional[str], total: Optional[int]) -> list[Answer]:
    """Run ``client(i, answered)`` in ``clients`` threads; their answers as they come back (a client
    calls ``answered(None)`` when it ends). A client's error is raised once every client has ended
    (the error that ended the load, rather than the broken start of the clients that waited for it)."""
    finished: queue.Queue = queue.Queue()

    def answered_until_all_ended():
        ended = 0
        while ended < clients:
            item = finished.get()
            if item is None:
                ended += 1
            else:
                yield item

    with ThreadPoolExecutor(clients) as pool:
        running = [pool.submit(client, i, finished.put) for i in range(clients)]
        stream = answered_until_all_ended()
        answers = list(bar(stream, total, progress) if progress else stream)
    errors = [error for ended in running if (error := ended.exception()) is not None]
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    return answers


def post_idempotent(
    client: httpx.Client,
    path: str,
    body: bytes | dict,
    what: str,
    headers: Optional[dict[str, str]] = None,
    attempts: int = ATTEMPTS,
) -> httpx.Response:
    """POST ``body`` (bytes as they are, a dict as JSON), sent again (after 0.25, 0.5, 1 s) where the
    connection failed before an answer came."""
    content = {"content": body} if isinstance(body, bytes) else {"json": body}
    for attempt in range(attempts):
        try:
            return client.post(path, headers=headers, **content)
        except RETRIED as error:
            if attempt == attempts - 1:
                raise
            wait = 0.25 * 2**attempt
            print(f"{what}: {type(error).__name__} ({error}), sent again in {wait:g} s", flush=True)
            time.sleep(wait)
    raise AssertionError("unreachable")
