"""Every rule of the read path through the HTTP API, on the world of ``api_fixtures``.

Each test states its expectation derived by hand from that world (module docstring there):
user 1's published list is 20 21 22 23 24 (ranks 1..5) with "followed by" [10 11 12],
[11 12 13], [12 13], [13 14], [10 14] and mutual counts 7 3 2 2 2.
"""

from __future__ import annotations

import datetime as dt

import pytest
from api_fixtures import NOW, bearer, candidates

from recs.serving import filters

ME = bearer(1)


def read(client, user=1, limit=None, headers=None):
    query = "" if limit is None else f"?limit={limit}"
    return client.get(f"/v1/users/{user}/who-to-follow{query}", headers=headers or bearer(user))


@pytest.fixture(params=["fetch-all", "per-id"])
def cap(request, monkeypatch):
    """Run a test twice: the user's exclusions fetched whole (cap 256) and asked per candidate
    list with IN (...) (cap 0, the path of users with many follows/blocks)."""
    if request.param == "per-id":
        monkeypatch.setattr(filters, "FETCH_ALL_CAP", 0)
    return request.param


def test_batch_list_as_published(client):
    """User 1 is 313 days old and follows 5 accounts: the batch list, unchanged: candidates
    20..24 ranked 1..5, others = mutual_count - len(followed_by) = 7-3, 3-3, 2-2, 2-2, 2-2."""
    response = read(client)
    body = response.json()
    assert body["source"] == "batch"
    assert body["run_id"] == "night_1"
    assert body["generated_at"] == "2026-11-02T00:00:00Z"
    assert body["user_id"] == 1
    assert [i["candidate_id"] for i in body["items"]] == [20, 21, 22, 23, 24]
    assert [i["rank"] for i in body["items"]] == [1, 2, 3, 4, 5]
    assert [i["mutual_count"] for i in body["items"]] == [7, 3, 2, 2, 2]
    assert body["items"][0]["followed_by"] == {"ids": [10, 11, 12], "others": 4}
    assert body["items"][1]["followed_by"] == {"ids": [11, 12, 13], "others": 0}
    assert body["items"][0]["score"] == pytest.approx(0.9)
    assert set(body["items"][0]) == {"candidate_id", "rank", "score", "mutual_count", "followed_by"}


def test_limit_truncates(client):
    """limit=2: the first two of 20..24."""
    assert candidates(read(client, limit=2)) == [20, 21]


def test_dismiss_then_read_is_gone(client, cap):
    """POST dismissal of 21 → 201; the next read is 20 22 23 24, re-ranked 1..4."""
    response = client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=ME)
    assert response.status_code == 201, response.text
    assert response.json()["created"] is True
    assert response.json()["dismissed_at"] == NOW.isoformat() + "Z"
    body = read(client).json()
    assert [i["candidate_id"] for i in body["items"]] == [20, 22, 23, 24]
    assert [i["rank"] for i in body["items"]] == [1, 2, 3, 4]


def test_dismissing_twice_is_idempotent(client):
    """The second POST of the same pair answers 200 with created false."""
    first = client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=ME)
    second = client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=ME)
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["created"] is False
    assert second.json()["dismissed_at"] == first.json()["dismissed_at"]


def test_dismissal_holds_in_a_later_batch_that_still_ranks_it(client, world):
    """Dismiss 21, then publish night_2 whose batch (built before the dismissal reached it)
    ranks 21 first: 21 is still dropped; the list is night_2's 24 20."""
    client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=ME)
    world.write_version("night_2", {1: [(21, 9, [10]), (24, 2, [10, 14]), (20, 7, [10])]})
    assert client.app.state.versions.refresh() is True
    body = read(client).json()
    assert body["run_id"] == "night_2"
    assert [i["candidate_id"] for i in body["items"]] == [24, 20]


def test_delete_undoes_a_dismissal(client):
    """Dismiss 21 then DELETE it: 204, and 21 is back at rank 2; a second DELETE is 404."""
    client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=ME)
    assert candidates(read(client)) == [20, 22, 23, 24]
    assert client.delete("/v1/users/1/dismissals/21", headers=ME).status_code == 204
    assert candidates(read(client)) == [20, 21, 22, 23, 24]
    again = client.delete("/v1/users/1/dismissals/21", headers=ME)
    assert again.status_code == 404
    assert again.json()["detail"] == "user 1 has not dismissed 21"


def test_followed_or_requested_since_the_batch_is_gone(client, world, cap):
    """1 follows 22 and requests 23 after the snapshot: the list is 20 21 24."""
    world.follow(1, 22)
    world.follow(1, 23, status="pending")
    assert candidates(read(client)) == [20, 21, 24]


@pytest.mark.parametrize("direction", ["user_blocks", "candidate_blocks"])
def test_block_in_either_direction_since_the_batch_is_gone(client, world, cap, direction):
    """1 blocks 20, or 20 blocks 1: either way 20 is gone: 21 22 23 24."""
    if direction == "user_blocks":
        world.block(1, 20)
    else:
        world.block(20, 1)
    assert candidates(read(client)) == [21, 22, 23, 24]


def test_muted_since_the_batch_is_gone(client, world, cap):
    """1 mutes 24: 20 21 22 23."""
    world.mute(1, 24)
    assert candidates(read(client)) == [20, 21, 22, 23]


def test_suspended_deactivated_or_hidden_since_the_batch_is_gone(client, world, cap):
    """20 suspended, 22 deactivated, 23 no longer discoverable: 21 24."""
    world.set_account(20, account_status="suspended")
    world.set_account(22, account_status="deactivated")
    world.set_account(23, is_discoverable=False)
    assert candidates(read(client)) == [21, 24]


def test_followed_by_ids_no_longer_followed_are_omitted(client, world):
    """1 unfollows 11: 20's "followed by" [10 11 12] becomes [10 12]; others stays 7-3 = 4."""
    world.execute("DELETE FROM follow_edges WHERE follower_id = 1 AND followee_id = 11")
    world.follow(1, 30)  # keep 5 follows, so user 1 stays on the batch path
    first = read(client).json()["items"][0]
    assert first["followed_by"] == {"ids": [10, 12], "others": 4}


def test_new_user_gets_cold_start_never_empty_never_self(client):
    """User 2 is 1 h old (tags music, sports; follows 10). Tag lists merged by in-degree:
    30 (90), 32 (85), 31 (80), 33 (75), 2 (70, itself), 40 (60, suspended now); then the
    global list adds 41 (hidden now), 34, 35. Dropping 2, 40 and 41: 30 32 31 33 34 35."""
    body = read(client, user=2).json()
    assert body["source"] == "cold_start" and body["cold_start_reason"] == "new_account"
    assert body["run_id"] == "night_1"
    assert [i["candidate_id"] for i in body["items"]][:6] == [30, 32, 31, 33, 34, 35]
    assert 2 not in [i["candidate_id"] for i in body["items"]]
    assert body["items"][0] == {
        "candidate_id": 30,
        "rank": 1,
        "score": None,
        "mutual_count": 0,
        "followed_by": {"ids": [], "others": 0},
    }


def test_cold_start_continues_into_the_pool(client):
    """User 2 with limit 10: after 30 32 31 33 34 35 the popularity lists are exhausted and the
    pool (recommendable accounts by in-degree: ... 20 (40), 21 (39), 22, 23, 24) follows."""
    assert candidates(read(client, user=2, limit=10)) == [30, 32, 31, 33, 34, 35, 20, 21, 22, 23]


def test_24_hour_rule_uses_the_clock(client, world):
    """Age exactly 24 h is no longer new (rule: younger than 24 h); 1 µs less is new. User 1
    with created_at moved: NOW - 24 h → batch; NOW - 24 h + 1 µs → cold start."""
    world.set_account(1, created_at=NOW - dt.timedelta(hours=24))
    body = read(client).json()
    assert body["source"] == "batch" and body["cold_start_reason"] is None
    world.set_account(1, created_at=NOW - dt.timedelta(hours=24) + dt.timedelta(microseconds=1))
    assert read(client).json()["source"] == "cold_start"


def test_fewer_than_five_follows_is_cold_start(client, world):
    """User 1 unfollows 14 (4 active follows left) → cold start; a pending request does not
    count as a follow (still 4) → cold start; a fifth active follow → batch again."""
    world.execute("DELETE FROM follow_edges WHERE follower_id = 1 AND followee_id = 14")
    assert read(client).json()["cold_start_reason"] == "thin_graph"
    world.follow(1, 35, status="pending")
    assert read(client).json()["source"] == "cold_start"
    world.follow(1, 34)
    assert read(client).json()["source"] == "batch"


def test_thin_user_with_a_batch_row_gets_cold_start(client):
    """User 3 follows 2 accounts but has a batch row (20): cold start. Tags sports: 32, 33;
    then global 30 31 2 (40, 41 dropped) 34 35: limit 4 → 32 33 30 31."""
    body = read(client, user=3, limit=4).json()
    assert body["source"] == "cold_start" and body["cold_start_reason"] == "thin_graph"
    assert [i["candidate_id"] for i in body["items"]] == [32, 33, 30, 31]


def test_no_batch_row_gets_cold_start_without_follows(client, cap):
    """User 4 (6 follows incl. 30, tags music, no batch row): music 30 (followed), 31, 2,
    40 (suspended); global adds 32 33 ...: limit 3 → 31 2 32."""
    body = read(client, user=4, limit=3).json()
    assert body["source"] == "cold_start" and body["cold_start_reason"] == "no_batch_row"
    assert [i["candidate_id"] for i in body["items"]] == [31, 2, 32]


def test_every_batch_row_dropped_falls_back_to_cold_start(client, world):
    """User 6's only batch row is 20; after dismissing 20 the list is cold start (no tags:
    the global list 30 32 31 33 2 ... with 20 never in it)."""
    world.dismiss(6, 20)
    body = read(client, user=6, limit=3).json()
    assert body["source"] == "cold_start" and body["cold_start_reason"] == "all_dropped"
    assert [i["candidate_id"] for i in body["items"]] == [30, 32, 31]


def test_cold_start_never_empty_when_every_listed_account_is_excluded(client, world):
    """User 2 follows, blocks, mutes or dismisses (in turn) every account of the index and the
    pool except itself, 40 (suspended) and 41 (hidden): all tiers are exhausted. The live-store
    scan by id then finds the eligible accounts in no list: 1 3 4 (5 suspended, 10 followed)
    6 11 12 13 14 → limit 3: 1 3 4."""
    listed = [30, 31, 32, 33, 34, 35, 20, 21, 22, 23, 24]
    for n, other in enumerate(listed):
        [world.follow, world.block, world.mute, world.dismiss][n % 4](2, other)
    assert candidates(read(client, user=2, limit=3)) == [1, 3, 4]


def test_cold_start_without_any_published_version(tmp_path, world):
    """Nothing published (CURRENT absent): /readyz is 503, yet user 2 still gets a list
    from the live store alone (by id, eligible only): 1 3 4 6 11 (10 is followed, 5 is
    suspended)."""
    from fastapi.testclient import TestClient

    from recs.config import Settings
    from recs.serving.api import create_app

    settings = Settings(
        home=world.home,
        store_url=world.settings.store_url,
        api_jwt_secret=world.settings.api_jwt_secret,
    )
    (world.published / "CURRENT").unlink()
    with TestClient(create_app(settings, clock=lambda: NOW, watch=False)) as client:
        assert client.get("/readyz").status_code == 503
        body = read(client, user=2, limit=5).json()
        settled = read(client, user=1, limit=5).json()  # not new, 5 follows: for want of a version
    assert settled["source"] == "cold_start" and settled["cold_start_reason"] == "no_version"
    assert body["source"] == "cold_start" and body["cold_start_reason"] == "new_account"
    assert body["run_id"] is None and body["generated_at"] is None
    assert [i["candidate_id"] for i in body["items"]] == [1, 3, 4, 6, 11]


def test_unsorted_shard_files_are_served_in_rank_order(client, world):
    """A shard file written out of (user_id, rank) order is indexed sorted on load."""
    import polars as pl

    from recs.published import shard_file
    from recs.sharding import shard_of

    world.write_version("night_2")
    path = shard_file(world.published, "night_2", shard_of(1, 4))
    shuffled = pl.read_parquet(path).sort("rank", descending=True)
    shuffled.write_parquet(path)
    import json

    manifest_path = world.published / "night_2" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())  # the file changed size: record it
    for shard in manifest["shards"]:
        shard["bytes"] = (world.published / "night_2" / shard["path"]).stat().st_size
    manifest_path.write_text(json.dumps(manifest))
    client.app.state.versions.refresh()
    assert candidates(read(client)) == [20, 21, 22, 23, 24]


def test_many_exclusions_at_once(client, world, cap):
    """21 and 22 dismissed, 23 blocked, 24 muted: only 20 is left (two rows in one table, so
    a fetch-all truncated by its LIMIT would miss one: it must fall back to per-id checks)."""
    world.dismiss(1, 21)
    world.dismiss(1, 22)
    world.block(1, 23)
    world.mute(1, 24)
    assert candidates(read(client)) == [20]
