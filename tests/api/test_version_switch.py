"""Versions across the workers of one server: one version per response, monotonic reads.

``recs serve --workers 2`` while a client reads user 1 then user 6 in a tight loop, each
request on a new connection (so both workers answer), and a new version is published every
0.7 s. Each version ``vNN`` gives both users a list no other version gives them, so a response
mixing versions would show. Checked over 10,000 pairs: every list is its run_id's; no
pair reads an older version second than first ("mixed pair"); no answer is older than one
already received ("regression").
"""

from __future__ import annotations

import itertools
import threading

import httpx
import pytest
from api_fixtures import bearer, make_world, point_current
from servers import served

pytestmark = pytest.mark.slow

PAIRS = 10_000


# Accounts neither user 1 nor user 6 follows (both follow 10..14): ordered pairs of them name a
# version's lists, so no two versions give either user the same list.
ACCOUNTS = (20, 21, 22, 23, 24, 30, 31, 32, 33, 34, 35)
LISTS = list(itertools.permutations(ACCOUNTS, 2))


def _expected(number: int) -> dict[int, list[int]]:
    return {1: list(LISTS[number]), 6: list(LISTS[(number + 50) % len(LISTS)])}


def _rows(number: int) -> dict:
    return {
        user: [(candidate, 5, [10]) for candidate in listed]
        for user, listed in _expected(number).items()
    }


class Publisher(threading.Thread):
    def __init__(self, world) -> None:
        super().__init__(daemon=True)
        self.world, self.stop, self.published = world, threading.Event(), 1

    def run(self) -> None:
        while not self.stop.wait(0.7) and self.published < len(LISTS) - 1:
            self.published += 1
            name = f"v{self.published:02d}"
            self.world.write_version(name, _rows(self.published), current=False)
            point_current(self.world.published, name)


def test_paired_reads_never_mix_or_go_back(tmp_path):
    world = make_world(tmp_path / "home")
    world.write_version("v01", _rows(1))
    world.engine.dispose()
    mixed, regressions, wrong, failures = 0, 0, [], []
    newest = 0
    seen: set[int] = set()
    with served(world, workers=2) as server:
        publisher = Publisher(world)
        publisher.start()
        limits = httpx.Limits(max_keepalive_connections=0)  # a new connection per request
        with httpx.Client(base_url=server.base, limits=limits, timeout=10) as client:
            for _ in range(PAIRS):
                numbers = []
                for user in (1, 6):
                    response = client.get(f"/v1/users/{user}/who-to-follow", headers=bearer(user))
                    if response.status_code != 200:
                        failures.append(response.text)
                        continue
                    body = response.json()
                    number = int(body["run_id"][1:])
                    got = [item["candidate_id"] for item in body["items"]]
                    if got != _expected(number)[user]:
                        wrong.append((body["run_id"], user, got))
                    if number < newest:
                        regressions += 1
                    newest = max(newest, number)
                    numbers.append(number)
                    seen.add(number)
                if len(numbers) == 2 and numbers[1] < numbers[0]:
                    mixed += 1
            metrics = client.get("/metrics", headers=bearer(0, service=True)).text
        publisher.stop.set()
        publisher.join(timeout=10)
    workers = {
        line.split('pid="', 1)[1].split('"', 1)[0]
        for line in metrics.splitlines()
        if line.startswith("recs_api_published_version_info{")
    }
    assert failures == [] and wrong == []
    assert (mixed, regressions) == (0, 0)
    assert len(seen) >= 10, sorted(seen)  # the switch happened many times under the loop
    assert len(workers) == 2
    # each worker logs its switches at INFO (server.log_config), v01 first: a worker of
    # --workers 2 logged none (no handler), and one worker logged them as warnings
    log = server.text()
    for pid in workers:
        assert f"recs.serving [{pid}] serving published version v01 (was none)" in log
    switches = [line for line in log.splitlines() if "serving published version" in line]
    assert switches and all(line.startswith("INFO:") for line in switches), switches[:5]
