"""The query stage's requests (sent again where a connection is cut) and the merge of their answers."""

import json
import socket
import struct
import threading

import httpx
import numpy as np
import pytest
import torch

from scaleforge.pipeline.load import ATTEMPTS, post_idempotent
from scaleforge.pipeline.query import concat_rows
from scaleforge.routing import choose_experts


def test_answers_of_a_router_that_lost_an_expert_between_requests_merge_row_by_row():
    """The MoE router traces the experts it used: two columns at top_k=2, one while one of two experts
    is down (as when an expert timed out under load). The query stage merges both batches, padding
    the narrower one, and the first expert of every row survives."""
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.5]])
    both = choose_experts(logits[:2], 2, torch.tensor([True, True]))
    one_down = choose_experts(logits[2:], 2, torch.tensor([False, True]))
    assert one_down.experts.shape == (1, 1)
    experts = concat_rows([both.experts.numpy(), one_down.experts.numpy()])
    fallback = concat_rows([both.fallback.numpy(), one_down.fallback.numpy()])
    assert experts.tolist() == [[0, 1], [1, 0], [1, -1]]
    # Expert 1 was among the row's top 2: fewer experts, not a fallback; the padding is no fallback either.
    assert fallback.tolist() == [[False, False], [False, False], [False, False]]
    classes = concat_rows([np.array([3, 4]), np.array([5])])  # one-dimensional outputs: plain concatenation
    assert classes.tolist() == [3, 4, 5]


class ResettingServer:
    """An HTTP server on 127.0.0.1 that reads each request and resets the first ``resets`` connections
    (SO_LINGER 0: the peer gets RST, as from a Serve proxy stopped with connections queued), then
    answers ``{"ok": n}`` where n counts the requests it read."""

    def __init__(self, resets: int):
        self.resets, self.requests = resets, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = conn.recv(65536)
                length = int(
                    next(
                        (
                            line.split(b":")[1]
                            for line in head.split(b"\r\n")
                            if line.lower().startswith(b"content-length")
                        ),
                        b"0",
                    )
                )
                while len(head.split(b"\r\n\r\n", 1)[-1]) < length:
                    head += conn.recv(65536)
                self.requests += 1
                if self.requests <= self.resets:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    continue
                body = json.dumps({"ok": self.requests}).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )

    def close(self):
        self.sock.close()


def test_an_inference_request_whose_connection_is_reset_is_sent_again(capsys):
    server = ResettingServer(resets=2)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            response = post_idempotent(
                client, "/v2/models/cascade/infer", {"inputs": []}, "[query] cascade: rows 0+"
            )
    finally:
        server.close()
    assert response.json() == {"ok": 3}
    retried = capsys.readouterr().out.splitlines()
    assert len(retried) == 2 and all(
        line.startswith("[query] cascade: rows 0+: ReadError (") for line in retried
    )
    assert retried[0].endswith("sent again in 0.25 s") and retried[1].endswith("sent again in 0.5 s")


def test_a_connection_reset_on_every_attempt_fails_the_request_with_the_transport_error():
    server = ResettingServer(resets=ATTEMPTS)
    try:
        with (
            httpx.Client(base_url=server.url, timeout=10) as client,
            pytest.raises(httpx.ReadError, match="reset"),
        ):
            post_idempotent(client, "/v2/models/moe/infer", {"inputs": []}, "[query] moe: rows 0+")
    finally:
        server.close()
    assert server.requests == ATTEMPTS


class ClassifyingServer:
    """A V2 inference server on 127.0.0.1 whose answer for a row is its first feature, as a class; it
    counts the requests it answered."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        owner = self
        self.requests, self.paths = 0, []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                tensor = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["inputs"][0]
                rows = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
                body = json.dumps(
                    {
                        "outputs": [
                            {
                                "name": "class",
                                "shape": [len(rows)],
                                "datatype": "INT64",
                                "data": rows[:, 0].astype(int).tolist(),
                            }
                        ]
                    }
                ).encode()
                owner.requests += 1
                owner.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("seconds", [0.0, 0.5])
def test_a_timed_query_sends_the_inputs_again_and_scores_the_first_pass(seconds):
    """One pass (seconds=0) sends each batch once; a timed one keeps every client busy until the time is
    up and counts every input it sent in the throughput, while the accuracy stays that of the inputs.
    The clients spread over the endpoint's URLs (two servers, as two ingress replicas' own ports)."""
    from scaleforge.config.pipeline import QuerySpec
    from scaleforge.pipeline.query import query_model

    y = np.arange(100) % 10
    x = np.zeros((100, 4), dtype=np.float32)
    x[:, 0] = np.where(np.arange(100) < 75, y, (y + 1) % 10)  # the first 75 rows answer right
    servers = [ClassifyingServer(), ClassifyingServer()]
    try:
        result = query_model(
            [s.url for s in servers],
            "teacher",
            x,
            y,
            QuerySpec(batch_size=16, concurrency=3, seconds=seconds),
        )
    finally:
        for server in servers:
            server.close()
    assert result.accuracy == 0.75
    assert result.requests == sum(s.requests for s in servers)
    if seconds:
        assert result.requests > 7 and result.seconds >= seconds
        assert all(s.requests for s in servers)  # every client kept sending until the time was up
    else:
        assert result.requests == 7  # 100 inputs in batches of 16
    sizes = [16] * 6 + [4]
    assert result.inputs_per_s * result.seconds == pytest.approx(
        sum(sizes[i % 7] for i in range(result.requests))
    )


def test_passes_alternate_the_models_and_each_row_is_its_median_pass():
    """Three passes over two models: the second pass runs them in reverse order, so that a drift in the
    machine's speed falls on both alike; each row is the pass whose inputs/s is the median, with every
    pass's beside it, and the ratio of two models is taken pass by pass."""
    from scaleforge.config.pipeline import QuerySpec
    from scaleforge.pipeline.query import query_passes

    y = np.arange(100) % 10
    x = np.zeros((100, 4), dtype=np.float32)
    x[:, 0] = y
    server = ClassifyingServer()
    try:
        results = query_passes(
            [server.url], ["teacher", "cascade"], x, y, QuerySpec(batch_size=16, concurrency=1, passes=3)
        )
    finally:
        server.close()
    models = [path.split("/")[3] for path in server.paths]  # /v2/models/<name>/infer
    runs = [models[i] for i in range(0, len(models), 7)]  # 7 requests a pass (100 inputs, batches of 16)
    assert models == [name for name in runs for _ in range(7)]
    assert runs == ["teacher", "cascade", "cascade", "teacher", "teacher", "cascade"]
    for result in results.values():
        assert result.accuracy == 1.0 and len(result.inputs_per_s_per_pass) == 3
        assert result.inputs_per_s == sorted(result.inputs_per_s_per_pass)[1]
    ratios = results["cascade"].ratios_per_pass(results["teacher"])
    assert ratios == [
        c / t for c, t in zip(*(results[n].inputs_per_s_per_pass for n in ("cascade", "teacher")))
    ]
