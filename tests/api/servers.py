"""Real ``recs serve`` processes for the tests that need a server as production runs it.

``served(world, workers=2, **settings)`` starts ``recs serve`` (uvicorn, its worker processes,
the HTTP limits) over a world's ``RECS_HOME`` and live store, waits for ``/readyz`` and yields
a ``Server`` (its base URL and process). ``settings`` become ``RECS_*`` environment variables
(``api_header_timeout_seconds=1`` → ``RECS_API_HEADER_TIMEOUT_SECONDS=1``).

``anyio_idle_seconds`` shortens anyio's worker-thread idle timeout (10 s) in the server's
processes, through ``soak_site/sitecustomize.py`` on ``PYTHONPATH``: bursts of requests with
idle gaps longer than it then fit in a short test. Nothing else about the server changes.

``access_log=True`` serves with ``--access-log`` (uvicorn's info level: every request, and the
supervisor's lines about its workers) and waits until every worker has finished its start-up;
``Server.events()`` is that log without the request lines, for a failure's message.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from api_fixtures import SECRET

BIN = Path(sys.executable).parent
SITE = Path(__file__).parent / "soak_site"


@dataclass
class Server:
    base: str
    process: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def events(self) -> str:
        """The log without its access lines (``access_log=True``): start-ups, deaths, errors."""
        return "\n".join(line for line in self.text().splitlines() if 'HTTP/1.1" ' not in line)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def served(
    world,
    *,
    workers: int = 2,
    anyio_idle_seconds: float | None = None,
    access_log: bool = False,
    **settings,
) -> Iterator[Server]:
    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("RECS_") and key != "PROMETHEUS_MULTIPROC_DIR"
    }
    env.update(
        RECS_HOME=str(world.home),
        RECS_API_JWT_SECRET=SECRET,
        RECS_API_RELOAD_INTERVAL_SECONDS="0.05",
        RECS_API_COLD_START_POOL="100",
    )
    if world.settings.store_url:
        env["RECS_STORE_URL"] = world.settings.store_url
    if "RECS_FILL_SHORT_LISTS" in os.environ:  # conftest: the batch lists unfilled
        env["RECS_FILL_SHORT_LISTS"] = os.environ["RECS_FILL_SHORT_LISTS"]
    for name, value in settings.items():
        env[f"RECS_{name.upper()}"] = str(value)
    if anyio_idle_seconds is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), env.get("PYTHONPATH")]))
        env["RECS_TEST_ANYIO_IDLE_SECONDS"] = str(anyio_idle_seconds)
    log = world.home / f"server-{port}.log"
    process = subprocess.Popen(
        [str(BIN / "recs"), "serve", "--port", str(port), "--workers", str(workers)]
        + (["--access-log"] if access_log else []),
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = Server(f"http://127.0.0.1:{port}", process, log)
    try:
        _wait_ready(server, workers if access_log else 0)
        yield server
    finally:
        stop(server)


def _wait_ready(server: Server, started: int = 0) -> None:
    """Until ``/readyz`` answers 200 and, with ``started``, that many workers logged the end of
    their start-up (uvicorn's "Application startup complete", info level)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"recs serve exited:\n{server.text()[-3000:]}")
        try:
            ready = httpx.get(f"{server.base}/readyz", timeout=2).status_code == 200
            if ready and server.text().count("Application startup complete") >= started:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"recs serve not ready in 60 s:\n{server.text()[-3000:]}")


def stop(server: Server) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=30)
