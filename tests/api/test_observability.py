"""/healthz, /readyz, /metrics, and ``recs recommend`` being the same read path as the API."""

from __future__ import annotations

import json

from api_fixtures import bearer
from prometheus_client import REGISTRY

WTF = "/v1/users/{}/who-to-follow"
ROUTE = "/v1/users/{user_id}/who-to-follow"


def _sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {
        "status": "ready",
        "run_id": "night_1",
        "snapshot_date": "2026-11-01",
        "generated_at": "2026-11-02T00:00:00Z",
    }


def test_metrics_latency_by_path_and_source_and_drops_by_reason(client, world):
    """One batch read of user 1 after 1 blocks 20 and mutes 22 (2 drops: blocked, muted),
    one cold-start read of user 2 (drops 2 = self, 40 = suspended, 41 = not_discoverable
    along the way): each histogram count +1 under its source, each reason +1."""
    world.block(1, 20)
    world.mute(1, 22)
    count = "recs_api_request_duration_seconds_count"
    before = {
        "batch": _sample(count, path=ROUTE, source="batch"),
        "cold": _sample(count, path=ROUTE, source="cold_start"),
        "blocked": _sample("recs_api_dropped_candidates_total", source="batch", reason="blocked"),
        "muted": _sample("recs_api_dropped_candidates_total", source="batch", reason="muted"),
        "self": _sample("recs_api_dropped_candidates_total", source="cold_start", reason="self"),
        "new": _sample("recs_api_cold_start_total", reason="new_account"),
    }
    assert client.get(WTF.format(1), headers=bearer(1)).json()["source"] == "batch"
    assert client.get(WTF.format(2), headers=bearer(2)).json()["source"] == "cold_start"
    assert _sample(count, path=ROUTE, source="batch") == before["batch"] + 1
    assert _sample(count, path=ROUTE, source="cold_start") == before["cold"] + 1
    dropped = "recs_api_dropped_candidates_total"
    assert _sample(dropped, source="batch", reason="blocked") == before["blocked"] + 1
    assert _sample(dropped, source="batch", reason="muted") == before["muted"] + 1
    assert _sample(dropped, source="cold_start", reason="self") == before["self"] + 1
    assert _sample("recs_api_cold_start_total", reason="new_account") == before["new"] + 1
    text = client.get("/metrics", headers=bearer(0, service=True)).text
    assert (
        f'recs_api_request_duration_seconds_bucket{{le="0.01",path="{ROUTE}",source="batch"}}'
        in (text)
    )
    assert 'recs_api_published_version_info{run_id="night_1"} 1.0' in text
    assert 'recs_api_dropped_candidates_total{reason="muted",source="batch"}' in text


def test_unmatched_paths_do_not_grow_label_sets(client):
    assert client.get("/v1/users/1/nothing-here").status_code == 404
    assert _sample("recs_api_requests_total", path="unmatched", method="GET", status="404") >= 1


def test_cli_recommend_prints_what_the_api_serves(client, world, monkeypatch, capsys):
    """`recs recommend 1 --json` (wall clock; user 1 is 10 months old, so the same path) equals
    the API's document for user 1, after a dismissal of 22 that both must honour."""
    from recs import cli
    from recs.config import get_settings

    client.post("/v1/users/1/dismissals", json={"candidate_id": 22}, headers=bearer(1))
    api = client.get(WTF.format(1), headers=bearer(1)).json()
    monkeypatch.setenv("RECS_HOME", str(world.home))
    if world.settings.store_url:
        monkeypatch.setenv("RECS_STORE_URL", world.settings.store_url)
    get_settings.cache_clear()
    try:
        assert cli.main(["recommend", "1", "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert cli.main(["recommend", "2", "--json", "--limit", "3"]) == 0
        cold = json.loads(capsys.readouterr().out)
    finally:
        get_settings.cache_clear()
    assert printed == api
    assert [i["candidate_id"] for i in printed["items"]] == [20, 21, 23, 24]
    # User 2 was created an hour before the fixture's clock, i.e. long ago by the wall
    # clock: it follows 1 account, so it is still a cold start (thin graph).
    assert cold["source"] == "cold_start"
    assert [i["candidate_id"] for i in cold["items"]] == [30, 32, 31]


def test_cli_recommend_unknown_user_is_one_line(world, monkeypatch, capsys):
    from recs import cli
    from recs.config import get_settings

    monkeypatch.setenv("RECS_HOME", str(world.home))
    if world.settings.store_url:
        monkeypatch.setenv("RECS_STORE_URL", world.settings.store_url)
    get_settings.cache_clear()
    try:
        assert cli.main(["recommend", "777"]) == 2
    finally:
        get_settings.cache_clear()
    assert capsys.readouterr().err == "recs: error: unknown user 777: not in the live store\n"
