"""Hot swap of the published version: no restart, no failed or mixed response.

Versions here: ``va`` gives user 1 the list 20 21 22, ``vb`` gives 23 24 (disjoint, so a
response mixing two versions would show it), ``night_1`` is the fixture's 20..24.
"""

from __future__ import annotations

import logging
import threading
import time

import httpx
from api_fixtures import NOW, bearer, candidates, point_current, running_server
from prometheus_client import REGISTRY

from recs.serving.versions import VersionCache

VA = {1: [(20, 5, [10]), (21, 4, [11]), (22, 3, [12])]}
VB = {1: [(23, 5, [13]), (24, 4, [14])]}
EXPECTED = {"va": [20, 21, 22], "vb": [23, 24]}


def test_swap_under_concurrent_reads(world):
    """A real uvicorn server (watcher every 10 ms) and 4 reader threads while CURRENT flips
    between va and vb every 15 ms for ~1.5 s: every response is 200 and exactly the list of
    the run_id it names; both versions are seen."""
    from recs.serving.api import create_app

    world.write_version("va", VA)
    world.write_version("vb", VB, current=False)
    app = create_app(world.settings, clock=lambda: NOW)
    stop = threading.Event()
    failures: list[str] = []
    seen: dict[str, int] = {"va": 0, "vb": 0}
    lock = threading.Lock()

    def reader(port: int) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=bearer(1)) as http:
            for _ in range(2000):  # bounded; normally stopped by the flag first
                if stop.is_set():
                    return
                response = http.get("/v1/users/1/who-to-follow")
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text}")
                    continue
                body = response.json()
                got = [item["candidate_id"] for item in body["items"]]
                if got != EXPECTED.get(body["run_id"]):
                    failures.append(f"mixed: {body['run_id']} {got}")
                with lock:
                    seen[body["run_id"]] += 1

    with running_server(app) as port:
        readers = [threading.Thread(target=reader, args=(port,)) for _ in range(4)]
        for each in readers:
            each.start()
        try:
            for flip in range(100):
                point_current(world.published, "vb" if flip % 2 == 0 else "va")
                time.sleep(0.015)
        finally:
            stop.set()
            for each in readers:
                each.join(timeout=30)
    assert failures == []
    assert seen["va"] > 0 and seen["vb"] > 0, seen
    assert sum(seen.values()) > 100


def test_refresh_keeps_the_old_version_when_the_new_one_is_damaged(world, client):
    """CURRENT → a version whose shard file is missing: refresh refuses it (counted), user 1
    is still served night_1; CURRENT → va (complete) swaps."""
    world.write_version("broken", VA)
    next(iter((world.published / "broken").glob("shard_id=*/recommendations.parquet"))).unlink()
    versions = client.app.state.versions
    failures = REGISTRY.get_sample_value("recs_api_version_load_failures_total") or 0.0
    assert versions.refresh() is False
    assert REGISTRY.get_sample_value("recs_api_version_load_failures_total") == failures + 1
    body = client.get("/v1/users/1/who-to-follow", headers=bearer(1)).json()
    assert body["run_id"] == "night_1"
    assert client.get("/readyz").json()["run_id"] == "night_1"
    assert versions.refresh() is False  # the same broken version is not retried
    world.write_version("va", VA)
    assert versions.refresh() is True
    assert candidates(client.get("/v1/users/1/who-to-follow", headers=bearer(1))) == [20, 21, 22]


def test_a_current_naming_no_version_keeps_the_served_one_and_is_logged_once(
    world, client, caplog
):
    """CURRENT emptied from outside: refresh keeps night_1 served and logs the error once (not
    every half second); a sound CURRENT again swaps as usual."""
    versions = client.app.state.versions
    (world.published / "CURRENT").write_text("")
    with caplog.at_level("ERROR", logger="recs.serving"):
        assert versions.refresh() is False
        assert versions.refresh() is False
    damaged = [r for r in caplog.records if "names no version" in r.getMessage()]
    assert len(damaged) == 1 and "serving the version already served" in damaged[0].getMessage()
    body = client.get("/v1/users/1/who-to-follow", headers=bearer(1)).json()
    assert body["run_id"] == "night_1"
    world.write_version("va", VA)
    assert versions.refresh() is True
    assert candidates(client.get("/v1/users/1/who-to-follow", headers=bearer(1))) == [20, 21, 22]


def test_rollback_reuses_the_cached_handle_and_the_metric_follows(world, client):
    """night_1 → va → night_1: the rollback is the very object served before (no reload);
    recs_api_published_version_info is 1 for the served run and 0 for the other."""
    versions = client.app.state.versions
    first = versions.active
    world.write_version("va", VA)
    assert versions.refresh() is True
    assert REGISTRY.get_sample_value("recs_api_published_version_info", {"run_id": "va"}) == 1
    assert REGISTRY.get_sample_value("recs_api_published_version_info", {"run_id": "night_1"}) == 0
    point_current(world.published, "night_1")
    assert versions.refresh() is True
    assert versions.active is first
    assert REGISTRY.get_sample_value("recs_api_published_version_info", {"run_id": "night_1"}) == 1


def test_a_rerun_replacing_a_version_folder_is_picked_up(world, client, caplog):
    """night_1 rewritten in place (same run id, new manifest): refresh reloads it."""
    assert candidates(client.get("/v1/users/1/who-to-follow", headers=bearer(1)))[0] == 20
    time.sleep(0.01)  # a distinct manifest mtime even on coarse-timestamp filesystems
    world.write_version("night_1", VB)
    with caplog.at_level(logging.INFO, logger="recs.serving"):
        assert client.app.state.versions.refresh() is True
    assert candidates(client.get("/v1/users/1/who-to-follow", headers=bearer(1))) == [23, 24]
    # (a newcomer read "serving published version night_1 (was night_1)"); at INFO, not WARNING
    # (another's: alerting on WARNING would fire every night)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "serving published version night_1 again: its files changed")
    ]


def test_first_version_appears_without_a_restart(world):
    """Start with nothing published (/readyz 503), publish: the watcher loads it."""
    (world.published / "CURRENT").unlink()
    versions = VersionCache(world.published, interval_seconds=0.01)
    versions.refresh()
    assert versions.active is None
    versions.start()
    try:
        point_current(world.published, "night_1")
        deadline = time.monotonic() + 10
        while versions.active is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        versions.stop()
    assert versions.active.run_id == "night_1"
