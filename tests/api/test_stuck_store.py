"""A PostgreSQL live store that stops answering (every server process SIGSTOPped: it cannot
even enforce its own statement_timeout) under ``recs serve --workers 2``.

Reads and dismissals answer 503 within twice ``api_store_timeout_ms`` (500 ms here) plus a
margin, never hang; ``/healthz`` keeps answering at once; when the server is continued, reads
are 200 again. A server of its own, so no other test's database is frozen.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx
import psutil
import pytest
from api_fixtures import bearer, make_world
from servers import served

from recs.testing import pgserver

pytestmark = pytest.mark.slow


def _processes(server) -> list[psutil.Process]:
    postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    root = psutil.Process(postmaster)
    return [root, *root.children(recursive=True)]


def _signal(processes, number) -> None:
    for process in processes:
        try:
            os.kill(process.pid, number)
        except ProcessLookupError:
            pass


def test_a_stopped_postgres_is_503_in_bounded_time_and_health_stays_up(tmp_path):
    if pgserver.find_bindir() is None:
        pytest.skip("no PostgreSQL server binaries")
    server = pgserver.start(durable=False)
    frozen: list[psutil.Process] = []
    try:
        world = make_world(tmp_path / "home", server.create_database("stuck"))
        world.engine.dispose()
        with served(world, workers=2, api_store_timeout_ms=500) as api:
            with httpx.Client(base_url=api.base, timeout=30) as client:
                assert client.get("/v1/users/1/who-to-follow", headers=bearer(1)).status_code == 200
                frozen = _processes(server)
                _signal(frozen, signal.SIGSTOP)

                def timed(method: str, path: str, **kwargs):
                    started = time.monotonic()
                    response = client.request(method, path, headers=bearer(1), **kwargs)
                    return response.status_code, time.monotonic() - started

                with concurrent.futures.ThreadPoolExecutor(12) as pool:
                    reads = [
                        pool.submit(timed, "GET", "/v1/users/1/who-to-follow") for _ in range(8)
                    ]
                    writes = [
                        pool.submit(
                            timed, "POST", "/v1/users/1/dismissals", json={"candidate_id": 21}
                        )
                        for _ in range(2)
                    ]
                    time.sleep(0.2)
                    health = [timed("GET", "/healthz") for _ in range(5)]
                    answers = [future.result() for future in reads + writes]
                _signal(frozen, signal.SIGCONT)
                frozen = []
                deadline = time.monotonic() + 20
                while True:
                    status = client.get("/v1/users/1/who-to-follow", headers=bearer(1))
                    if status.status_code == 200 or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
    finally:
        _signal(frozen, signal.SIGCONT)
        server.stop()
    assert {code for code, _ in answers} == {503}
    assert max(seconds for _, seconds in answers) < 2.5  # 2 x 500 ms, plus a wait for a slot
    assert {code for code, _ in health} == {200}
    assert max(seconds for _, seconds in health) < 0.1
    assert status.status_code == 200
