"""The top-up of short batch lists from cold start (``fill_short_lists``, issue 13), on the
world of ``api_fixtures``: the only API tests with the fill on (``conftest``)."""

from __future__ import annotations

from api_fixtures import NOW, bearer, candidates

from recs.config import Settings


def read(client, user, limit):
    return client.get(f"/v1/users/{user}/who-to-follow?limit={limit}", headers=bearer(user))


def test_a_short_batch_list_is_topped_up_after_its_own_rows(client):
    """User 1 (tags music) has 5 batch rows, 20..24; limit 8 adds 3 cold-start items: music 30,
    31, 2 (40 is suspended since the snapshot: dropped), ranked 6..8 without a score, and the
    list stays a batch list."""
    body = read(client, 1, 8).json()
    assert body["source"] == "batch"
    assert candidates(read(client, 1, 8)) == [20, 21, 22, 23, 24, 30, 31, 2]
    assert [i["rank"] for i in body["items"]] == list(range(1, 9))
    assert [i["score"] for i in body["items"][5:]] == [None, None, None]
    assert [i["mutual_count"] for i in body["items"][5:]] == [0, 0, 0]
    assert body["items"][0]["score"] is not None


def test_the_top_up_never_repeats_a_batch_row(client):
    """User 6 (no tags): batch 20, then the global list 30 32 31 33 2 34 35 (40 suspended, 41
    hidden: dropped), then the pool by in-degree, where 20 comes again: skipped, so 21 22."""
    assert candidates(read(client, 6, 10)) == [20, 30, 32, 31, 33, 2, 34, 35, 21, 22]


def test_a_full_batch_list_is_not_topped_up(client):
    """limit 5 and 5 batch rows: nothing added."""
    assert candidates(read(client, 1, 5)) == [20, 21, 22, 23, 24]


def test_fill_off_serves_the_batch_list_alone(world):
    """fill_short_lists false: user 6 gets its one batch row."""
    from fastapi.testclient import TestClient

    from recs.serving.api import create_app

    settings = Settings(**{**world.settings.model_dump(), "store_url": world.settings.store_url,
                           "api_jwt_secret": world.settings.api_jwt_secret,
                           "fill_short_lists": False})
    with TestClient(create_app(settings, clock=lambda: NOW, watch=False)) as client:
        assert candidates(read(client, 6, 10)) == [20]
