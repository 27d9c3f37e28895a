"""The HTTP limits of ``recs serve`` (``recs.serving.server``), each against a real server.

One worker process here, so an abusive client and the probe share one event loop: the
strictest case (with more workers the probe may simply land on another one). The probe reads
user 3's list over a keep-alive connection in a loop and records each request's latency.

Settings: header timeout 1 s, keep-alive timeout 1 s, body timeout 0.5 s, headers at most
16,384 bytes (the default); a second server caps connections at 4.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from api_fixtures import bearer, make_world
from servers import served

pytestmark = pytest.mark.slow

LIMITS = dict(
    api_header_timeout_seconds=1,
    api_keepalive_timeout_seconds=1,
    api_body_timeout_seconds=0.5,
)


class Probe(threading.Thread):
    """Sequential reads of user 3's list; ``latencies`` in seconds with their start times."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base, self.stop, self.samples = base, threading.Event(), []

    def run(self) -> None:
        with httpx.Client(base_url=self.base, headers=bearer(3), timeout=30) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                status = client.get("/v1/users/3/who-to-follow").status_code
                self.samples.append((started, time.monotonic() - started, status))
                time.sleep(0.002)

    def worst(self, start: float, end: float) -> float:
        """The slowest probe request that was in progress at any time in ``start .. end``."""
        inside = [seconds for at, seconds, _ in self.samples if at <= end and at + seconds >= start]
        assert inside, "no probe request in the window"
        return max(inside)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    world = make_world(tmp_path_factory.mktemp("limits") / "home")
    with served(world, workers=1, **LIMITS) as running:
        yield running
    world.engine.dispose()


def _address(server) -> tuple[str, int]:
    host, port = server.base.removeprefix("http://").split(":")
    return host, int(port)


def _response(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection (or ``timeout``)."""
    sock.settimeout(timeout)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks)


def _not_stalled(server, attack, attempts: int = 3):
    """Run ``attack`` until the probe is not delayed 100 ms more than just before it (at most
    ``attempts`` times; returns the last result). A shared machine can stall any process for a
    moment, once; the stall this guards against (a 30 MiB header took 1-4 s of the event loop)
    happens on every attempt."""
    seen = []
    for _ in range(attempts):
        before, during, result = _probe_during(server, attack)
        seen.append((round(before, 3), round(during, 3)))
        if during < before + 0.1:
            return result
    raise AssertionError(f"the probe was delayed on every attempt: (before, during) = {seen}")


def _probe_during(server, attack) -> tuple[float, float, object]:
    """(worst probe latency before the attack, during it, the attack's result)."""
    probe = Probe(server.base)
    probe.start()
    time.sleep(1.0)
    start = time.monotonic()
    result = attack()
    end = time.monotonic() + 0.3  # what the server still has to chew on after the client stops
    time.sleep(0.5)
    probe.stop.set()
    probe.join(timeout=30)
    assert {status for _, _, status in probe.samples} == {200}
    return probe.worst(start - 1.0, start), probe.worst(start, end), result


def test_a_30_mib_header_is_refused_without_stalling_others(server):
    """A request whose Authorization header is 30 MiB: the server answers 431 and closes long
    before the 30 MiB are sent; the probe is never delayed 100 ms more than before."""

    def attack():
        with socket.create_connection(_address(server)) as sock:
            sock.sendall(b"GET /v1/users/1/who-to-follow HTTP/1.1\r\nHost: t\r\n")
            sent, block = 0, b"a" * 65536
            try:
                sock.sendall(b"Authorization: Bearer ")
                while sent < 30 * 1024 * 1024:
                    sock.sendall(block)
                    sent += len(block)
                sock.sendall(b"\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            return sent, _response(sock, timeout=2)

    sent, answer = _not_stalled(server, attack)
    assert sent < 30 * 1024 * 1024  # cut off
    if answer:  # the 431 may be lost to the reset of a connection closed mid-upload
        assert answer.startswith(b"HTTP/1.1 431 ")


def test_slow_header_clients_are_cut_off_without_stalling_others(server):
    """50 connections trickling a header byte every 0.2 s: each is answered 408 and closed
    after the 1 s header timeout (not held for ever); the probe is not delayed 100 ms."""

    def attack():
        sockets = [socket.create_connection(_address(server)) for _ in range(50)]
        closed_at: dict[int, float] = {}
        opened = time.monotonic()
        line = b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"z" * 40
        for position in range(len(line)):
            for index, sock in enumerate(sockets):
                if index in closed_at:
                    continue
                try:
                    sock.sendall(line[position : position + 1])
                except (BrokenPipeError, ConnectionResetError):
                    closed_at[index] = time.monotonic() - opened
            if len(closed_at) == len(sockets):
                break
            time.sleep(0.2)
        answers = [_response(sock, timeout=0.5) for sock in sockets]
        for sock in sockets:
            sock.close()
        return closed_at, answers

    closed_at, answers = _not_stalled(server, attack)
    assert len(closed_at) == 50  # every one of them, within the trickle (~9 s)
    assert max(closed_at.values()) < 3.0
    statuses = {answer.split(b"\r\n", 1)[0] for answer in answers if answer}
    assert statuses <= {b"HTTP/1.1 408 Request Timeout"}


def test_headers_over_the_limit_are_431(server):
    """A 20 KiB header: 431 with a JSON detail naming the limit; the connection is closed."""
    with socket.create_connection(_address(server)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n")
        answer = _response(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large")
    assert json.loads(body) == {"detail": "request headers over 16,384 bytes"}


def test_headers_under_the_limit_are_served(server):
    """A 12 KiB header is below the 16 KiB limit: /healthz answers 200."""
    response = httpx.get(f"{server.base}/healthz", headers={"X-Big": "b" * 12_000})
    assert response.status_code == 200


def test_an_idle_keep_alive_connection_is_closed(server):
    """After a response, a keep-alive connection left idle 1.5 s (timeout 1 s) is closed."""
    with socket.create_connection(_address(server)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        sock.settimeout(5)
        first = sock.recv(65536)
        while not first.endswith(b'{"status":"ok"}'):  # the body may come in its own segment
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        time.sleep(1.5)
        sock.settimeout(1.0)  # uvicorn's own default (5 s) would time this out
        assert sock.recv(65536) == b""  # closed by the server


def test_a_body_that_never_arrives_is_408(server):
    """Content-Length 40 and 10 bytes sent, then nothing: 408 after the 0.5 s body timeout."""
    headers = {**bearer(1), "Content-Type": "application/json", "Content-Length": "40"}
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection(_address(server)) as sock:
        started = time.monotonic()
        sock.sendall(
            f"POST /v1/users/1/dismissals HTTP/1.1\r\nHost: t\r\n{head}\r\n".encode() + b'{"candida'
        )
        sock.settimeout(5)
        answer = sock.recv(65536)
        waited = time.monotonic() - started
        while answer.count(b"}") < 1:
            answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert body == {"detail": "request body not received within 0.5 s (api_body_timeout_seconds)"}
    assert 0.4 < waited < 3.0


def test_connections_over_the_cap_get_503(tmp_path):
    """api_max_connections 4: with 4 connections open, a request on a fifth is 503 at once; once
    they close, requests are served again."""
    world = make_world(tmp_path / "home")
    with served(world, workers=1, api_max_connections=4) as running:
        address = _address(running)
        held = [socket.create_connection(address) for _ in range(4)]
        time.sleep(0.2)
        try:
            refused = httpx.get(f"{running.base}/healthz", timeout=5)
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)
        again = httpx.get(f"{running.base}/healthz", timeout=5)
    world.engine.dispose()
    assert refused.status_code == 503
    assert again.status_code == 200
