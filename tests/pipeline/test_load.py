"""The library's closed-loop load generator (the query stage's and the serving benches'): warm-up
requests not counted, a load stopped from outside, requests with no HTTP answer."""

import math
import socket
import threading

import httpx
import numpy as np
import pytest
from test_query import ClassifyingServer

from scaleforge.pipeline.load import closed_loop, infer_request


def _request(first_feature: int):
    rows = np.zeros((4, 3), dtype=np.float32)
    rows[:, 0] = first_feature
    return infer_request("/v2/models/m/infer", rows, {})


def test_warm_up_requests_are_sent_but_not_counted_and_every_answer_is_read():
    server = ClassifyingServer()
    try:
        load = closed_loop(
            [server.url],
            [_request(3), _request(5)],
            lambda ticket, response: response.json()["outputs"][0]["data"],
            2,
            at_least=5,
            warmup=True,
        )
    finally:
        server.close()
    assert server.requests == 7  # 2 uncounted, one per client, then tickets 0 to 4
    assert sorted(a.ticket for a in load.answers) == [0, 1, 2, 3, 4]
    assert all(a.value == [[3, 5][a.ticket % 2]] * 4 and a.status == 200 for a in load.answers)


def _dead_url() -> str:
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_load_stopped_from_outside_ends_once_each_client_has_its_answer():
    server, stop = ClassifyingServer(), threading.Event()
    try:
        load = closed_loop(
            [server.url], [_request(1)], lambda ticket, r: ticket >= 3 and stop.set(), 2, math.inf, stop=stop
        )
    finally:
        server.close()
    # Tickets 0 to 3, and the other client's request in flight when ticket 3's answer set stop.
    assert 4 <= len(load.answers) <= 5 and server.requests == len(load.answers)


def test_requests_that_got_no_answer_are_recorded_as_status_0():
    load = closed_loop(
        [_dead_url()], [_request(1)], lambda t, r: None, 2, 0.2, at_least=1, attempts=1, record_errors=True
    )
    assert load.answers and all(a.status == 0 and a.value is None for a in load.answers)


def test_without_record_errors_a_request_with_no_answer_ends_the_load_with_its_error():
    with pytest.raises(httpx.ConnectError):
        closed_loop([_dead_url()], [_request(1)], lambda t, r: None, 2, 10.0, attempts=1)
