"""The live store failing: dismissals, blocks and mutes fail closed (503, never shown); the
follow and account-state checks fail open (served, counted).

World (``api_fixtures``): user 1's list is 20 21 22 23 24.
"""

from __future__ import annotations

from api_fixtures import NOW, bearer, candidates
from prometheus_client import REGISTRY

from recs.errors import StoreUnavailableError

ME = bearer(1)
WTF = "/v1/users/1/who-to-follow"


def _fail(*_args, **_kwargs):
    raise StoreUnavailableError("live store unavailable (test): connection refused")


def test_unreachable_store_answers_503_for_reads_and_writes(world):
    """The store URL names a file that does not exist (opened mode=rw, so no empty database
    is created in its place): the read is 503 naming the missing file and the likely cause
    (RECS_HOME relative to the working folder), the dismissal is 503, health stays 200."""
    from fastapi.testclient import TestClient

    from recs.config import Settings
    from recs.serving.api import create_app

    missing = world.home / "gone.db"
    settings = Settings(
        home=world.home, api_jwt_secret=world.settings.api_jwt_secret,
        store_url=f"sqlite:///{missing}",
    )  # fmt: skip
    with TestClient(create_app(settings, clock=lambda: NOW, watch=False)) as client:
        response = client.get(WTF, headers=ME)
        assert response.status_code == 503
        assert response.json()["detail"].startswith("live store unavailable (account): ")
        assert f"no SQLite file at {missing}" in response.json()["detail"]
        assert "RECS_HOME is relative to the working folder" in response.json()["detail"]
        post = client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=ME)
        assert post.status_code == 503
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200  # the version is loaded
    assert not missing.exists()


def test_store_going_down_never_shows_a_dismissed_account(client, monkeypatch):
    """Dismiss 21 (served list 20 22 23 24), then every new query fails at the driver
    (its OperationalError, e.g. sqlite3's): reads are 503, never a list containing 21. When
    the store is back, 21 is still gone."""
    client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=ME)
    assert candidates(client.get(WTF, headers=ME)) == [20, 22, 23, 24]
    store = client.app.state.store

    driver_error = store._engine.dialect.dbapi.OperationalError

    def broken():
        raise driver_error("disk I/O error")

    monkeypatch.setattr(store._engine, "raw_connection", broken)  # every checkout fails
    for _ in range(3):
        response = client.get(WTF, headers=ME)
        assert response.status_code == 503
        assert response.json()["detail"] == "live store unavailable (account): disk I/O error"
    monkeypatch.undo()
    assert candidates(client.get(WTF, headers=ME)) == [20, 22, 23, 24]


def test_hard_check_failing_alone_is_503(client, world, monkeypatch):
    """Only the dismissal/block/mute query fails: 503 (fail closed), for batch and cold start."""
    world.dismiss(1, 21)
    monkeypatch.setattr(client.app.state.store, "hard_exclusions", _fail)
    for user in (1, 2):
        response = client.get(f"/v1/users/{user}/who-to-follow", headers=bearer(user))
        assert response.status_code == 503
        assert "connection refused" in response.json()["detail"]


def test_soft_checks_fail_open_but_dismissals_still_hold(client, world, monkeypatch):
    """21 dismissed and 22 followed since the snapshot; the follow and account-state queries
    fail: 22 is served (fail open, counted once), 21 is not (fail closed): 20 22 23 24, with
    "followed by" as published."""
    world.dismiss(1, 21)
    world.follow(1, 22)
    before = (
        REGISTRY.get_sample_value("recs_api_fail_open_total", {"check": "follows_and_accounts"})
        or 0.0
    )
    store = client.app.state.store
    monkeypatch.setattr(store, "follows", _fail)
    monkeypatch.setattr(store, "account_states", _fail)
    response = client.get(WTF, headers=ME)
    assert candidates(response) == [20, 22, 23, 24]
    assert response.json()["items"][0]["followed_by"] == {"ids": [10, 11, 12], "others": 4}
    after = REGISTRY.get_sample_value("recs_api_fail_open_total", {"check": "follows_and_accounts"})
    assert after == before + 1
