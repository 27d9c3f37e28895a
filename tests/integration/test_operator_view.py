"""The operator's view in a real Airflow API server, looked at in a real headless Chromium.

One module fixture makes a small real history in a throwaway home: a synthetic graph (2,000
users), ``airflow dags test`` of the nightly DAG for 2026-11-01 (an Airflow run, published),
then a CLI run ``carried`` of the same date whose shard 2 raises (so its version carries shard
2 over from the Airflow run and becomes current, the Airflow run its rollback target). Then it
starts ``airflow api-server`` with this repository's plugin and logs in through Airflow's own
``POST /auth/token`` (simple auth manager, its generated admin password).

The tests check that the plugin's routes refuse anonymous and forged requests, then load the
pages in Chromium with the UI's ``_token`` cookie and assert on the rendered DOM: the versions
table with each version's role, charts drawn by vega-embed as ``<svg>``, the shard statuses of
each run as its files say, Airflow's stage states, the gate's expectations; the same views
inside Airflow's UI (the plugin's iframe, its ``{DAG_ID}``/``{RUN_ID}`` substituted); and the
run's Great Expectations Data Docs. Screenshots go to the test's tmp dir, and to
``$RECS_SCREENSHOT_DIR`` when it is set.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from airflow_env import airflow_env
from browser import Browser, find_chromium

from tests.needs import need

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DATE = "2026-11-01"
DAG_ID = "recs_who_to_follow_nightly"
CARRIED = "carried"

pytestmark = pytest.mark.slow

FAILING_SHARD_RUN = f"""
import recs.traversal
from recs.config import get_settings
from recs.nightly import pipeline

real = recs.traversal.traverse_shard

def traverse(paths, settings, shard_id, **options):
    if shard_id == 2:
        raise RuntimeError("injected traversal failure")
    return real(paths, settings, shard_id, **options)

recs.traversal.traverse_shard = traverse
pipeline.run_all(get_settings().home, "{DATE}", "{CARRIED}")
"""


def _run(args: list[str], env: dict[str, str], timeout: int = 1200) -> str:
    result = subprocess.run(
        args, env=env, capture_output=True, text=True, cwd=REPO, timeout=timeout
    )
    assert result.returncode == 0, (
        f"{' '.join(args[:4])} exited {result.returncode}\n{result.stdout[-3000:]}\n"
        f"{result.stderr[-3000:]}"
    )
    return result.stdout


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def chromium() -> str:
    return need(
        find_chromium(),
        "no chromium (make test installs Debian's chromium package; or set RECS_CHROMIUM)",
        "RECS_REQUIRE_BROWSER",
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The history above, an API server with the plugin, and an admin token."""
    home = tmp_path_factory.mktemp("operator-view")
    env = {**airflow_env(home), "RECS_SHARD_COUNT": "4"}
    data = home / "data"
    _run([str(BIN / "recs"), "generate-graph", "--users", "2000", "--replace"], env)
    _run([str(BIN / "airflow"), "db", "migrate"], env)
    _run([str(BIN / "airflow"), "pools", "set", "recs_duckdb_writer", "1", "one writer"], env)
    _run([str(BIN / "airflow"), "dags", "test", DAG_ID, DATE], env, timeout=1800)
    (airflow_dir,) = [p for p in (data / "runs" / DATE).iterdir() if p.name.startswith("manual")]
    _run([sys.executable, "-c", FAILING_SHARD_RUN], env, timeout=1800)

    port = _free_port()
    log = (home / "api-server.log").open("w")
    server = subprocess.Popen(
        [str(BIN / "airflow"), "api-server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        env={**env, "AIRFLOW__API__PORT": str(port)},
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        token = _wait_and_login(base, home / "airflow", server, home / "api-server.log")
        shots = tmp_path_factory.mktemp("screenshots")
        yield {
            "base": base,
            "token": token,
            "data": data,
            "airflow_run_id": _airflow_run_id(base, token),
            "airflow_folder": airflow_dir.name,
            "shots": shots,
        }
    finally:
        _stop(server)
        log.close()


def _wait_and_login(base: str, airflow_home: Path, server, log: Path, timeout: float = 240) -> str:
    """Wait for the API server, then get a JWT from POST /auth/token with the admin password
    the simple auth manager generated into AIRFLOW_HOME."""
    deadline = time.monotonic() + timeout
    passwords = airflow_home / "simple_auth_manager_passwords.json.generated"
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-4000:]
        try:
            with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5):
                pass
        except OSError:
            time.sleep(1)
            continue
        if passwords.is_file():
            break
        time.sleep(1)
    else:
        raise TimeoutError(f"API server not up: {log.read_text()[-4000:]}")
    password = json.loads(passwords.read_text())["admin"]
    request = urllib.request.Request(
        f"{base}/auth/token",
        data=json.dumps({"username": "admin", "password": password}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.load(reply)["access_token"]


def _airflow_run_id(base: str, token: str) -> str:
    status, body = _get(f"{base}/api/v2/dags/{DAG_ID}/dagRuns", token)
    assert status == 200, body
    (run,) = json.loads(body)["dag_runs"]
    return run["dag_run_id"]


def _stop(server) -> None:
    """Stop the API server we started, and its workers (its own process group only)."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
    try:
        os.killpg(server.pid, signal.SIGKILL)  # children that outlived the leader
    except ProcessLookupError:
        pass


def _get(url: str, token: str | None = None, cookie: str | None = None) -> tuple[int, str]:
    headers = {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if cookie:
        headers["Cookie"] = f"_token={cookie}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _quoted(run_id: str) -> str:
    return urllib.parse.quote(run_id, safe="")


def _save(site, browser: Browser, name: str) -> Path:
    path = browser.screenshot(site["shots"] / name)
    target = os.environ.get("RECS_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / name)
    return path


def test_the_plugin_routes_refuse_anonymous_and_forged_requests(site):
    """Airflow's own auth guards every route: no credential is 401, a forged token 403; the
    UI's _token cookie and a bearer token are both accepted."""
    base, run = site["base"], _quoted(site["airflow_run_id"])
    runs = f"/recs/runs/{DAG_ID}/{run}"
    routes = ["/recs/", "/recs/api/versions", runs, f"/recs/api/runs/{DAG_ID}/{run}",
              f"{runs}/data-docs/index.html", f"{runs}/files/results.json",
              "/recs/static/vendor/vega.min.js"]  # fmt: skip
    for route in routes:
        status, body = _get(base + route)
        assert status == 401, (route, status, body[:200])
        assert _get(base + route, token="forged.jwt.token")[0] == 403, route
        assert _get(base + route, cookie=site["token"])[0] == 200, route
    status, body = _get(base + f"/recs/api/runs/{DAG_ID}/{run}", token=site["token"])
    report = json.loads(body)
    assert report["airflow_run_id"] == site["airflow_run_id"]
    assert {s["state"] for s in report["stages"]} == {"success"}


def test_the_plugin_registers_its_nav_and_dag_run_views(site):
    status, body = _get(site["base"] + "/api/v2/plugins", token=site["token"])
    assert status == 200, body
    (plugin,) = [p for p in json.loads(body)["plugins"] if p["name"] == "recs_operator_view"]
    views = {v["destination"]: v for v in plugin["external_views"]}
    assert views["nav"]["href"] == "recs/" and views["nav"]["url_route"] == "who-to-follow"
    assert views["dag_run"]["href"] == "recs/runs/{DAG_ID}/{RUN_ID}"
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/recs"]


def test_run_report_renders_versions_charts_and_shard_statuses(site, chromium):
    base, token = site["base"], site["token"]
    with Browser(chromium) as browser:
        browser.set_cookie("_token", token, base)

        # The Airflow run: computed shards, Airflow's task states, the gate, charts.
        browser.goto(f"{base}/recs/runs/{DAG_ID}/{_quoted(site['airflow_run_id'])}")
        drawn = browser.wait_for(
            "document.querySelectorAll('.chart[data-rendered=true] svg').length >= 4 && "
            "document.querySelectorAll('.chart[data-rendered=true] svg').length"
        )
        assert drawn >= 4  # stages, skew, hub traffic, gate (no comparison: first version)
        assert (
            browser.evaluate("document.querySelectorAll('.chart[data-rendered=error]').length") == 0
        )
        assert (
            browser.evaluate("document.getElementById('run-id').textContent")
            == site["airflow_folder"]
        )
        statuses = browser.evaluate(
            "[...document.querySelectorAll('#shards tbody tr')].map(r => r.dataset.status)"
        )
        assert statuses == ["computed"] * 4
        states = browser.evaluate(
            "[...document.querySelectorAll('#stages tbody tr')]"
            ".map(r => r.cells[1].textContent.trim())"
        )
        assert states[:7] == ["success"] * 7
        assert (
            browser.evaluate(
                "document.querySelectorAll('tr[data-check][data-status=passed]').length"
            )
            >= 32
        )
        roles = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('#versions tbody tr')]"
            ".map(r => [r.dataset.runId, r.dataset.role]))"
        )
        assert roles == {CARRIED: "current", site["airflow_folder"]: "rollback target"}
        assert browser.evaluate("!!document.getElementById('data-docs-link')")
        _save(site, browser, "run-report-airflow-run.png")

        # The CLI run with a failed shard: carried over from the Airflow run, compared with it.
        browser.goto(f"{base}/recs/runs/{DAG_ID}/{CARRIED}")
        browser.wait_for("document.querySelectorAll('.chart[data-rendered=true] svg').length >= 4")
        rows = browser.evaluate(
            "[...document.querySelectorAll('#shards tbody tr')]"
            ".map(r => [r.dataset.status, r.cells[2].textContent.trim()])"
        )
        assert rows[2] == ["carried_over", site["airflow_folder"]]
        assert [status for status, _ in rows] == [
            "computed",
            "computed",
            "carried_over",
            "computed",
        ]
        assert browser.evaluate("!!document.querySelector('#chart-volume svg')")  # compared
        _save(site, browser, "run-report-carried-shard.png")

        # The navigation page: versions chart and table, runs.
        browser.goto(f"{base}/recs/")
        browser.wait_for("!!document.querySelector('#chart-versions[data-rendered=true] svg')")
        assert browser.evaluate("document.getElementById('current').textContent") == CARRIED
        assert browser.evaluate("document.querySelectorAll('#runs tbody tr').length") == 2
        _save(site, browser, "versions-page.png")


def test_the_views_open_inside_airflows_ui(site, chromium):
    """Airflow's UI shows the nav page and the run view in its iframe (same origin, so the
    test reads the frame's DOM), with {DAG_ID} and {RUN_ID} substituted."""
    base, token = site["base"], site["token"]
    frame = "document.querySelector('iframe')"
    with Browser(chromium) as browser:
        browser.set_cookie("_token", token, base)
        browser.goto(f"{base}/plugin/who-to-follow")
        inner = f"{frame}.contentDocument"
        rows = f"{inner}.querySelector('#versions tbody tr')"
        browser.wait_for(f"!!({frame} && {inner} && {rows})", 90)
        browser.wait_for(f"!!{inner}.querySelector('.chart[data-rendered=true] svg')")
        time.sleep(1)
        _save(site, browser, "airflow-ui-who-to-follow.png")

        run = _quoted(site["airflow_run_id"])
        browser.goto(f"{base}/dags/{DAG_ID}/runs/{run}/plugin/who-to-follow-run")
        src = browser.wait_for(f"{frame} ? {frame}.getAttribute('src') : null", 90)
        assert src == f"recs/runs/{DAG_ID}/{run}", src
        browser.wait_for(f"!!({frame}.contentDocument && {frame}.contentDocument.querySelectorAll("
                         "'.chart[data-rendered=true] svg').length >= 4)", 90)  # fmt: skip
        statuses = browser.evaluate(
            f"[...{frame}.contentDocument.querySelectorAll('#shards tbody tr')]"
            ".map(r => r.dataset.status)")  # fmt: skip
        assert statuses == ["computed"] * 4
        time.sleep(1)
        _save(site, browser, "airflow-ui-run-view.png")


def test_data_docs_open_from_the_run_report(site, chromium):
    """GX's Data Docs of the Airflow run, offline: the index's table (drawn by bootstrap-table,
    which the site serves itself) lists the five suites' validation results (the run's, and
    each shard's of the other four); a validation page shows the gate's expectations with their
    results."""
    base, token = site["base"], site["token"]
    docs = f"{base}/recs/runs/{DAG_ID}/{_quoted(site['airflow_run_id'])}/data-docs/index.html"
    with Browser(chromium) as browser:
        browser.set_cookie("_token", token, base)
        browser.goto(docs)
        drawn = browser.wait_for(  # rows bootstrap-table draws, from the site's own copy
            "[...document.querySelectorAll('tr[data-href*=\"validations/\"]')]"
            ".map(row => new URL(row.dataset.href, document.baseURI).href)"
        )
        # one validation per shard and batch: more than a page, so ask the table for them all
        links = browser.evaluate(
            "[...document.querySelectorAll('table[data-toggle=\"table\"]')]"
            ".flatMap(t => jQuery(t).bootstrapTable('getData'))"
            ".map(r => r._table_row_link_path).filter(p => p && p.includes('validations/'))"
            ".map(p => new URL(p, document.baseURI).href)"
        )
        assert drawn and set(drawn) <= set(links)
        suites = {link.split("validations/")[1].split("/")[0] for link in links}
        assert suites == {"recs_run", "recs_recommendations", "recs_recommendation_rules",
                          "recs_users", "recs_shards"}  # fmt: skip
        _save(site, browser, "data-docs-index.png")
        users_page = next(link for link in links if "validations/recs_users/" in link)
        browser.goto(users_page)
        text = browser.wait_for("document.body && document.body.innerText")
        assert "rank" in text and "in_home_shard" in text
        assert browser.evaluate("document.querySelectorAll('table').length") >= 1
        _save(site, browser, "data-docs-validation.png")
