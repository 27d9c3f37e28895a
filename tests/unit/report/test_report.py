"""recs.report on a hand-built run folder: shard statuses, the skew rule, the gate, versions,
and the app's guards (every route depends on the auth dependency it is given).

The run: 4 shards; traversals 100, 120, 500 (shard 2) and none for shard 3, which has no
manifest. Median of the computed shards' traversals (100, 120, 500) is 120, so the threshold is
240 and only shard 2 (500 > 240, ratio 4.17) is flagged. The published version of the run says
shard 3 was carried over from ``night_0``. Hub share of shard 0: 25 / 100.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient

from recs.nightly.runs import RunPaths
from recs.report import charts
from recs.report.content import run_report
from recs.report.versions import versions_report
from recs.report.web import create_app

DATE = dt.date(2026, 11, 1)
TRAVERSALS = {0: (100, 25), 1: (120, 6), 2: (500, 50)}


def _write(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))


@pytest.fixture
def run(tmp_path) -> RunPaths:
    paths = RunPaths(tmp_path, DATE, "night_1")
    _write(paths.snapshot_manifest, {"shard_count": 4, "settings": {
        "shard_count": 4, "gate_max_drop": 0.25, "gate_max_growth": 3.0}})  # fmt: skip
    for shard_id, (traversals, hubs) in TRAVERSALS.items():
        _write(paths.shard_manifest(shard_id), {
            "shard_id": shard_id, "users_in": 10, "users_with_recommendations": 8, "rows": 40,
            "traversals": traversals, "hub_traversals": hubs, "seconds": 1.5,
            "peak_rss_mb": 300.0})  # fmt: skip
    _write(paths.validation_dir / "summary.json", {
        "outcome": "passed", "rows": 120, "users": 24, "replaced_rows": 100,
        "replaced_users": 30, "compared_with": "night_0", "skipped": []})  # fmt: skip
    _write(paths.validation_dir / "results.json", {"checkpoints": [{
        "name": "recs_gate_run", "batch": "run", "rows": 1, "success": False, "expectations": [
            {"name": "a", "success": True, "errored": False, "result": {"unexpected_count": 0}},
            {"name": "b", "success": False, "errored": False, "result": {}},
            {"name": "c", "success": False, "errored": True, "exception": "boom"}]}]})  # fmt: skip
    _write(paths.run_dir / "dbt" / "target" / "run_results.json", {"elapsed_time": 9.0, "results": [
        {"unique_id": "model.recs.hub_accounts", "status": "success"},
        {"unique_id": "test.recs.unique_x", "status": "fail", "failures": 3, "message": "Got 3"},
        {"unique_id": "exposure.recs.read_api", "status": "no-op"}]})  # fmt: skip
    published = tmp_path / "published"
    for name, date in (("night_0", "2026-10-31"), ("night_1", "2026-11-01")):
        _write(published / name / "manifest.json", {
            "run_id": name, "snapshot_date": date, "shard_count": 4, "rows": 100, "users": 30,
            "validation": {"success": True}, "shards": [
                {"shard_id": i, "status": "carried_over" if name == "night_1" and i == 3
                 else "computed", "carried_from": "night_0" if name == "night_1" and i == 3
                 else None} for i in range(4)]})  # fmt: skip
    (published / "CURRENT").write_text("night_1\n")
    return paths


def test_shards_skew_gate_volume_hubs_and_dbt(run):
    report = run_report(run)
    shards = report["shards"]
    assert [s["status"] for s in shards] == ["computed", "computed", "computed", "carried_over"]
    assert shards[3]["carried_from"] == "night_0"
    assert report["skew"]["median_traversals"] == 120 and report["skew"]["threshold"] == 240
    assert report["skew"]["flagged"] == [2] and shards[2]["skewed"] is True
    assert shards[2]["cost_ratio"] == pytest.approx(500 / 120)
    assert shards[0]["hub_share"] == 0.25
    assert report["hubs"]["share"] == pytest.approx(81 / 720)
    gate = report["gate"]
    assert (gate["passed"], gate["failed"], gate["errored"]) == (1, 1, 1)
    volume = {m["measure"]: m for m in report["volume"]["measures"]}
    assert volume["users with lists"]["change"] == pytest.approx(-0.2)
    assert volume["users with lists"]["within_bounds"] is True
    assert [p["unique_id"] for p in report["dbt"]["problems"]] == ["test.recs.unique_x"]
    assert report["run"]["is_current"] is True
    assert all(s["source"] == "files" for s in report["stages"])
    for spec in (charts.skew_chart(shards, report["skew"]), charts.hub_chart(shards),
                 charts.gate_chart(gate), charts.volume_chart(report["volume"])):  # fmt: skip
        assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/v6")


def test_a_shard_without_manifest_or_carry_over_is_failed_once_validated(run):
    (run.home / "published" / "night_1" / "manifest.json").unlink()
    assert run_report(run)["shards"][3]["status"] == "failed"
    (run.validation_dir / "summary.json").unlink()
    assert run_report(run)["shards"][3]["status"] == "not run"


def test_airflow_task_instances_give_the_stage_timings(run):
    start = dt.datetime(2026, 11, 2, 0, 0, tzinfo=dt.UTC)
    tis = [{"task_id": "freeze_snapshot", "map_index": -1, "state": "success",
            "start_date": start.isoformat(),
            "end_date": (start + dt.timedelta(seconds=5)).isoformat(), "try_number": 1}] + [
           {"task_id": "traverse_shard", "map_index": i, "state": "failed" if i == 3 else "success",
            "start_date": (start + dt.timedelta(seconds=10 + i)).isoformat(),
            "end_date": (start + dt.timedelta(seconds=20 + i)).isoformat(), "try_number": 3}
           for i in range(4)]  # fmt: skip
    stages = {s["stage"]: s for s in run_report(run, tis)["stages"]}
    assert stages["freeze_snapshot"]["seconds"] == 5 and stages["freeze_snapshot"]["offset"] == 0
    assert stages["traverse_shard"]["seconds"] == 13
    assert stages["traverse_shard"]["state"] == "failed"
    assert stages["traverse_shard"]["mapped"] is True
    assert stages["build_models"]["state"] == "no task"
    assert charts.stage_chart(list(stages.values())) is not None


def test_a_recs_run_gives_its_stage_seconds_from_its_own_record(run):
    """(From a newcomer: 9 of 11 stages had no seconds for a ``recs run``.) Without Airflow,
    the seconds ``run_all`` recorded (``stage_times.json``) stand, over dbt's own elapsed time
    and the shards' sum; a stage it did not reach keeps those, else None."""
    stages = {s["stage"]: s["seconds"] for s in run_report(run)["stages"]}
    assert (stages["build_models"], stages["traverse_shard"], stages["freeze_snapshot"]) == (
        9.0, 4.5, None)  # fmt: skip
    _write(run.stage_times, {"stages": {"freeze_snapshot": 1.25, "build_models": 12.5}})
    stages = {s["stage"]: s["seconds"] for s in run_report(run)["stages"]}
    assert (stages["freeze_snapshot"], stages["build_models"], stages["traverse_shard"]) == (
        1.25, 12.5, 4.5)  # fmt: skip
    assert stages["publish_run"] is None


def test_recs_report_says_where_a_dag_runs_stage_seconds_are(run):
    """(From a newcomer: after `make demo`, a DAG run, `recs report` gave two stages' seconds
    and nothing on the others.) Without `recs run`'s record, the text names the run view that
    shows Airflow's task records; with it, only the seconds."""
    from recs.cli.report import _stage_seconds

    document = run_report(run)
    assert document["files"]["stage_times"] is None
    assert _stage_seconds(document, "night_1") == (
        "build_models 9.0, traverse_shard 4.5 (from the run's files; if Airflow ran it, its "
        "task records hold every stage's: the run view "
        "/recs/runs/recs_who_to_follow_nightly/night_1 in Airflow's UI; if recs run did, it "
        "records them in stage_times.json, which this run lacks)"
    )
    _write(run.stage_times, {"stages": {"freeze_snapshot": 2.5}})
    document = run_report(run)
    assert document["files"]["stage_times"] == str(run.stage_times)
    assert _stage_seconds(document, "night_1") == (
        "freeze_snapshot 2.5, build_models 9.0, traverse_shard 4.5"
    )
    airflow = [{"task_id": "publish_run", "map_index": -1, "state": "success",
                "start_date": "2026-11-02T00:00:00+00:00", "end_date": "2026-11-02T00:00:03+00:00",
                "duration": 3.0, "try_number": 1}]  # fmt: skip
    run.stage_times.unlink()  # the view's own report: Airflow's records, no pointer to itself
    assert _stage_seconds(run_report(run, airflow), "night_1") == "publish_run 3.0"


def test_recs_report_does_not_send_a_recs_runs_missing_seconds_to_airflow(run):
    """(From a review.) A run with the CLI's own id (``cli__<date>``) was made by `recs run`,
    never by Airflow: without its ``stage_times.json`` the text says that file is missing
    instead of naming a run view that has no such run."""
    from recs.cli.report import _stage_seconds

    assert _stage_seconds(run_report(run), "cli__2026-11-01") == (
        "build_models 9.0, traverse_shard 4.5 (from the run's files; recs run records the "
        "others in stage_times.json, which this run lacks)"
    )


def test_recs_report_names_the_checks_that_did_not_pass(run):
    """(From a newcomer: the text said "failed: 33 of 35 passed" only.)"""
    from recs.cli.report import _not_passed

    assert _not_passed(run_report(run)["gate"]) == ["b", "c (errored)"]


def test_a_shard_computed_since_the_gate_makes_its_verdict_stale(run):
    """(From a newcomer: after `recs shard run`, the summary said "passed (stale …)" and the
    report "passed: 35 of 35".) A shard manifest newer than the gate's summary: both say so."""
    import os

    from recs.nightly.reporting import run_summary

    assert run_report(run)["gate"]["stale"] is False
    later = run.validation_summary.stat().st_mtime + 5
    os.utime(run.shard_manifest(2), (later, later))
    assert run_report(run)["gate"]["stale"] is True
    assert run_summary(run.home, DATE, "night_1")["totals"]["validation_stale"] is True


def test_a_version_of_the_same_run_id_on_another_date_is_not_this_run(run):
    """(From a review: a never-validated run of 2026-11-05 reusing the id of a published
    2026-11-01 version was reported "published: yes, CURRENT".)"""
    other = RunPaths(run.home, dt.date(2026, 11, 5), "night_1")
    _write(other.snapshot_manifest, {"shard_count": 4, "settings": {"shard_count": 4}})
    report = run_report(other)
    assert (report["run"]["published"], report["run"]["is_current"]) == (False, False)
    assert report["gate"]["outcome"] == "not validated" and report["gate"]["evaluated"] == 0
    assert (run_report(run)["run"]["published"], run_report(run)["run"]["is_current"]) == (
        True, True)  # fmt: skip


def test_versions_name_current_and_rollback_target(run):
    report = versions_report(run.home / "published")
    assert [(v["run_id"], v["role"], v["rollback_command"]) for v in report["versions"]] == [
        ("night_1", "current", None),
        ("night_0", "rollback target", "recs rollback"),
    ]


def test_every_route_depends_on_the_auth_it_is_given(run):
    """The plugin passes Airflow's requires_access_dag; here a stand-in that refuses."""

    def refuse():
        raise HTTPException(401, "Not authenticated")

    seen: list[str] = []

    def allow_run(dag_id: str):
        seen.append(dag_id)

    refused = TestClient(create_app(authorize_run=refuse, authorize_nightly=refuse,
                                    home=lambda: run.home))  # fmt: skip
    allowed = TestClient(create_app(authorize_run=allow_run, authorize_nightly=lambda: None,
                                    home=lambda: run.home))  # fmt: skip
    dag = "recs_who_to_follow_nightly"
    for route in ("/", "/api/versions", f"/runs/{dag}/night_1", f"/api/runs/{dag}/night_1",
                  f"/runs/{dag}/night_1/files/summary.json", "/static/report.js",
                  f"/runs/{dag}/night_1/data-docs/index.html", f"/runs/{dag}/night_1/dbt-docs"):
        assert refused.get(route).status_code == 401, route  # fmt: skip
    assert allowed.get(f"/runs/{dag}/night_1").status_code == 200
    assert allowed.get(f"/api/runs/{dag}/night_1").json()["skew"]["flagged"] == [2]
    assert allowed.get(f"/runs/{dag}/night_1/files/../../../../etc/passwd").status_code == 404
    assert allowed.get("/static/../content.py").status_code == 404
    assert allowed.get("/runs/recs_ingest_events/x").status_code == 200  # a note, no report
    assert seen[:2] == [dag, dag]


def test_the_vendored_vega_lite_is_the_version_altair_writes():
    import altair

    from recs.report.pages import STATIC_DIR

    build = (STATIC_DIR / "vendor" / "vega-lite.min.js").read_text()
    assert f'"{altair.SCHEMA_VERSION.lstrip("v")}"' in build


@pytest.mark.parametrize(
    ("dbt_results", "damage"),
    [('{"results": "x"}', ""), ("[1, 2]", "[1]"), ('{"elapsed_time": "x", "results": [1]}', "{")],
)
def test_damaged_files_are_named_and_the_pages_still_render(run, dbt_results, damage):
    """A truncated summary.json is not "not validated" but "unreadable", and the page names
    every damaged file; dbt results of the wrong shape are "not available", not a 500; the
    versions page survives CURRENT's manifest damaged."""
    (run.validation_dir / "summary.json").write_text(damage)
    (run.run_dir / "dbt" / "target" / "run_results.json").write_text(dbt_results)
    (run.home / "published" / "night_1" / "manifest.json").write_text(damage)
    report = run_report(run)
    assert report["run"]["outcome"] == "unreadable"
    not_an_object = [run.run_dir / "dbt" / "target" / "run_results.json"] * (
        not dbt_results.startswith("{")
    )  # an object of the wrong shape is read, and found "not available" below
    assert report["damaged"] == [str(path) for path in [
        run.home / "published" / "night_1" / "manifest.json",
        run.validation_dir / "summary.json",
        *not_an_object,
    ]]  # fmt: skip
    assert report["dbt"]["available"] is False
    client = TestClient(create_app(authorize_run=lambda dag_id: None,
                                   authorize_nightly=lambda: None, home=lambda: run.home))
    page = client.get("/runs/recs_who_to_follow_nightly/night_1")
    assert page.status_code == 200 and 'id="damaged"' in page.text
    assert "summary.json" in page.text.split('id="damaged"')[1].split("</p>")[0]
    for route in ("/", "/api/versions"):
        assert client.get(route).status_code == 200, route


def test_a_run_whose_version_was_removed_says_so_on_its_pages(run):
    """(From a newcomer: "not published" of a run served for days, after `recs gc` removed its
    version.) night_0's version gone, the history recording its publish: the run view's badge
    and the runs table say it was published and removed since; a run never published (no
    event) stays "not published"."""
    import shutil

    from recs.nightly import history

    shutil.rmtree(run.home / "published" / "night_0")
    at = history.record(
        run.home / "published", "publish", "night_0", None, current=True, snapshot_date="2026-10-31"
    )["at"]
    old = RunPaths(run.home, dt.date(2026, 10, 31), "night_0")
    _write(old.snapshot_manifest, {"shard_count": 4, "settings": {"shard_count": 4}})
    never = RunPaths(run.home, dt.date(2026, 10, 30), "night_9")
    _write(never.snapshot_manifest, {"shard_count": 4, "settings": {"shard_count": 4}})
    client = TestClient(create_app(authorize_run=lambda dag_id: None,
                                   authorize_nightly=lambda: None, home=lambda: run.home))
    page = client.get("/runs/recs_who_to_follow_nightly/night_0").text
    assert f'title="published at {at}">published, version removed since</span>' in page
    page = client.get("/runs/recs_who_to_follow_nightly/night_9").text
    assert "not published</span>" in page and "removed since" not in page
    rows = client.get("/").text.split('id="runs"')[1].split("</table>")[0].split("<tr>")
    cells = {row.split("</a>")[0].rsplit(">", 1)[-1]: row for row in rows[2:]}
    assert "<td>no longer (removed since)</td>" in cells["night_0"]
    assert "<td>no</td>" in cells["night_9"] and "<td>yes</td>" in cells["night_1"]
