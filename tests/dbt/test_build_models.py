"""``recs.nightly.models.build_models``: ``dbt build`` on a hand-built snapshot, exports exact.

The snapshot (written with Polars in exactly ``SNAPSHOT_SCHEMAS``, follow edges under
``follow_edges/shard_id=NNN/part-0.parquet`` by ``shard_of(follower_id, 4)``, in-degrees
counted from them by ``recs.nightly.in_degrees.from_follow_edges``, so the hand-derived
in-degrees below check it too). Run: snapshot
date 2026-11-01, so as_of = 2026-11-02 00:00 UTC and, with the 30-day window, the eligibility
cut-off is 2026-10-03 00:00. Settings: 4 shards, fixed hub threshold 3, popularity_per_tag 100.

Accounts (id: status, last_active_at, discoverable)::

    1  active       2026-11-01 10:00  yes
    2  active       2026-10-30 08:00  yes
    3  active       2026-10-31 20:00  yes
    4  active       2026-10-03 00:00  yes   exactly at the cut-off: eligible
    5  suspended    2026-11-01 09:00  yes   suspended: not eligible, not recommendable
    6  active       2026-10-02 23:59  yes   dormant (a minute past 30 days): not eligible
    7  active       2026-10-25 12:00  no    private, undiscoverable: eligible, not recommendable
    8  active       2026-11-01 18:00  yes   the hub
    9  deactivated  2026-08-01 00:00  yes
    BIG = 5000000000  active  never   yes   a large id, never active: not eligible

Follow edges: 1->8, 2->8, 3->8, 4->8, 1->2, 3->2, 4->2, 2->3, 5->3, 8->1 active; 1->7 and 6->4
pending. In-degree over active follows: 8: 4, 2: 3, 3: 2 (2, and the suspended 5 still
counts), 1: 1, all others 0 (pending requests count nothing). Hubs at threshold 3: 2 (exactly
3) and 8 (4).

Blocks: 1 blocks 3 and 3 blocks 1 (both ways); 4 blocks 1. Mutes: 2 mutes 5. Dismissed: 1
dismissed 6. So follow_exclusions (user_id, excluded_id, reason) has 8 rows: blocked (1,3)
(3,1) (4,1), blocked_by (3,1) (1,3) (1,4), muted (2,5), dismissed (1,6); the follows (active
or pending) are not repeated there (the traversal reads them from the snapshot's edges).

eligible_users: 1, 2, 3, 4, 7, 8. candidate_profiles: all 10 accounts; recommendable (active
and discoverable): 1, 2, 3, 4, 6, 8, BIG.

Interests: 1 music; 2 music, sport; 3 music; 4 '_global' (reserved: dropped); 5 music;
7 sport; 8 sport, news; 9 news. popularity_index (recommendable and followed only, in_degree
desc then candidate_id asc; 4, 6 and BIG have no follower)::

    _global: 8 (4), 2 (3), 3 (2), 1 (1)
    music:   2 (3), 3 (2), 1 (1)      5 is suspended
    news:    8 (4)                    9 is deactivated
    sport:   8 (4), 2 (3)             7 is undiscoverable
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from pathlib import Path

import polars as pl
import pytest

from recs.config import Settings
from recs.contracts import EXPORT_SCHEMAS, SNAPSHOT_SCHEMAS, check_schema
from recs.errors import ModelsBuildError, RecsError, RunNotFoundError
from recs.nightly import in_degrees
from recs.nightly.models import build_models, dbt_args, release_duckdb
from recs.nightly.runs import RunPaths
from recs.sharding import shard_of

BIG = 5_000_000_000
SNAPSHOT_DATE = "2026-11-01"
SHARDS = 4
CREATED = dt.datetime(2025, 1, 1)

USERS = [
    # user_id, last_active_at, account_status, is_discoverable, is_private
    (1, "2026-11-01 10:00:00", "active", True, False),
    (2, "2026-10-30 08:00:00", "active", True, False),
    (3, "2026-10-31 20:00:00", "active", True, False),
    (4, "2026-10-03 00:00:00", "active", True, False),
    (5, "2026-11-01 09:00:00", "suspended", True, False),
    (6, "2026-10-02 23:59:00", "active", True, False),
    (7, "2026-10-25 12:00:00", "active", False, True),
    (8, "2026-11-01 18:00:00", "active", True, False),
    (9, "2026-08-01 00:00:00", "deactivated", True, False),
    (BIG, None, "active", True, False),
]
ACTIVE_FOLLOWS = [(1, 8), (2, 8), (3, 8), (4, 8), (1, 2), (3, 2), (4, 2), (2, 3), (5, 3), (8, 1)]
PENDING_FOLLOWS = [(1, 7), (6, 4)]
BLOCKS = [(1, 3), (3, 1), (4, 1)]
MUTES = [(2, 5)]
DISMISSALS = [(1, 6)]
INTERESTS = [
    (1, "music"), (2, "music"), (2, "sport"), (3, "music"), (4, "_global"), (5, "music"),
    (7, "sport"), (8, "sport"), (8, "news"), (9, "news"),
]  # fmt: skip


def _at(text: str | None) -> dt.datetime | None:
    return None if text is None else dt.datetime.fromisoformat(text)


def _frame(table: str, rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=SNAPSHOT_SCHEMAS[table], orient="row")


def write_snapshot(paths: RunPaths, users=USERS, active_follows=ACTIVE_FOLLOWS) -> None:
    """The snapshot files of ``paths`` laid out as freeze_snapshot writes them."""
    snapshot = paths.snapshot_dir
    snapshot.mkdir(parents=True)
    _frame(
        "users",
        [(uid, CREATED, _at(last), status, disc, priv) for uid, last, status, disc, priv in users],
    ).write_parquet(snapshot / "users.parquet")
    edges = [(a, b, CREATED, "active") for a, b in active_follows]
    edges += [(a, b, CREATED, "pending") for a, b in PENDING_FOLLOWS]
    for shard in sorted({shard_of(a, SHARDS) for a, *_ in edges}):
        folder = snapshot / "follow_edges" / f"shard_id={shard:03d}"
        folder.mkdir(parents=True)
        part = [edge for edge in edges if shard_of(edge[0], SHARDS) == shard]
        _frame("follow_edges", part).write_parquet(folder / "part-0.parquet")
    pair_tables = {"blocks": BLOCKS, "mutes": MUTES, "dismissed_candidates": DISMISSALS}
    for table, pairs in pair_tables.items():
        frame = _frame(table, [(a, b, CREATED) for a, b in pairs])
        frame.write_parquet(snapshot / f"{table}.parquet")
    _frame("user_interests", INTERESTS).write_parquet(snapshot / "user_interests.parquet")
    in_degrees.from_follow_edges(snapshot).write_parquet(snapshot / in_degrees.FILE)


def settings_for(home: Path, hub_threshold: int = 3) -> Settings:
    """The brief's settings: 4 shards, a fixed hub threshold (3), every other default."""
    return Settings(home=home, shard_count=SHARDS, hub_in_degree_threshold=hub_threshold)


@pytest.fixture(scope="module")
def built_run(tmp_path_factory):
    """One ``build_models`` of the fixture snapshot: ``(paths, summary)``."""
    home = tmp_path_factory.mktemp("recs-home")
    paths = RunPaths.create(home, SNAPSHOT_DATE, "test")
    write_snapshot(paths)
    summary = build_models(paths, settings_for(home))
    logging.getLogger(__name__).warning("dbt build of the fixture took %.1f s", summary["seconds"])
    return paths, summary


def read_export(paths: RunPaths, name: str) -> pl.DataFrame:
    """An export as written, read back with hive partitioning (shard_id from the folder name)."""
    if name in ("eligible_users", "follow_exclusions"):
        files = paths.exports_dir / name / "**" / "*.parquet"
        return pl.read_parquet(files, hive_partitioning=True)
    return pl.read_parquet(paths.exports_dir / f"{name}.parquet")


def data_test_count(paths: RunPaths) -> int:
    """The data tests (not unit tests) in the manifest of the run's build."""
    manifest = json.loads((paths.run_dir / "dbt" / "target" / "manifest.json").read_text())
    return sum(node["resource_type"] == "test" for node in manifest["nodes"].values())


def rows(frame: pl.DataFrame, *columns: str) -> list[tuple]:
    return sorted(frame.select(columns).iter_rows())


def test_every_export_has_exactly_its_contract_schema(built_run):
    paths, _ = built_run
    for name, expected in EXPORT_SCHEMAS.items():
        schema = dict(read_export(paths, name).schema)
        schema.pop("shard_id", None)
        check_schema(schema, expected, f"export {name}")


def test_partitioned_exports_are_hive_folders_by_shard_of_user_id(built_run):
    paths, _ = built_run
    owners = {"eligible_users": (1, 2, 3, 4, 7, 8), "follow_exclusions": (1, 2, 3, 4)}
    for name in ("eligible_users", "follow_exclusions"):
        folders = sorted(p.name for p in (paths.exports_dir / name).iterdir())
        # one folder per shard that has rows (DuckDB writes no empty partition)
        assert folders == sorted({f"shard_id={shard_of(u, SHARDS)}" for u in owners[name]})
        for folder in (paths.exports_dir / name).iterdir():
            shard = int(folder.name.split("=")[1])
            files = list(folder.glob("*.parquet"))
            assert len(files) == 1
            content = pl.read_parquet(files[0])
            assert "shard_id" not in content.columns
            assert all(shard_of(u, SHARDS) == shard for u in content["user_id"])


def test_hub_accounts(built_run):
    paths, _ = built_run
    assert rows(read_export(paths, "hub_accounts"), "user_id", "in_degree") == [(2, 3), (8, 4)]


def test_follow_exclusions_union_every_reason(built_run):
    paths, _ = built_run
    expected = [
        (1, 3, "blocked"), (3, 1, "blocked"), (4, 1, "blocked"),
        (3, 1, "blocked_by"), (1, 3, "blocked_by"), (1, 4, "blocked_by"),
        (2, 5, "muted"),
        (1, 6, "dismissed"),
    ]  # fmt: skip
    got = read_export(paths, "follow_exclusions")
    assert rows(got, "user_id", "excluded_id", "reason") == sorted(expected)
    assert len(expected) == 8


def test_eligible_users_active_within_window(built_run):
    paths, _ = built_run
    got = read_export(paths, "eligible_users")
    expected = [(user_id, shard_of(user_id, SHARDS)) for user_id in (1, 2, 3, 4, 7, 8)]
    assert rows(got, "user_id", "shard_id") == expected


def test_candidate_profiles(built_run):
    paths, _ = built_run
    in_degree = {8: 4, 2: 3, 3: 2, 1: 1}
    recommendable = {1, 2, 3, 4, 6, 8, BIG}
    expected = [
        (uid, status, _at(last), disc, in_degree.get(uid, 0), uid in recommendable)
        for uid, last, status, disc, _ in USERS
    ]
    got = read_export(paths, "candidate_profiles")
    assert got.columns == list(EXPORT_SCHEMAS["candidate_profiles"])
    assert list(got.iter_rows()) == sorted(expected)  # written in candidate_id order


def test_popularity_index(built_run):
    paths, _ = built_run
    lists = {
        "_global": [(8, 4), (2, 3), (3, 2), (1, 1)],
        "music": [(2, 3), (3, 2), (1, 1)],
        "news": [(8, 4)],
        "sport": [(8, 4), (2, 3)],
    }
    expected = [
        (tag, candidate, rank, degree)
        for tag, ranked in sorted(lists.items())
        for rank, (candidate, degree) in enumerate(ranked, start=1)
    ]
    got = read_export(paths, "popularity_index")
    assert list(got.iter_rows()) == expected  # written in (tag, popularity_rank) order


def test_summary_counts_rows_and_tests(built_run):
    paths, summary = built_run
    assert summary["rows"] == {
        "eligible_users": 6,
        "follow_exclusions": 8,
        "candidate_profiles": 10,
        "popularity_index": 10,
        "hub_accounts": 2,
    }
    assert summary["warehouse"] == str(paths.warehouse) and paths.warehouse.is_file()
    assert summary["exports_dir"] == str(paths.exports_dir)
    # every data test of the project ran and passed (the unit tests run in CI: below)
    assert summary["tests_passed"] == data_test_count(paths) > 80 and summary["tests_warned"] == 0
    assert summary["models_built"] == 19  # 7 staging, 2 intermediate, 5 marts, 5 exports
    # dbt's own files stay under the run; the DuckDB file is closed once build_models returns
    assert (paths.run_dir / "dbt" / "target" / "run_results.json").is_file()
    import duckdb

    with duckdb.connect(str(paths.warehouse), read_only=True) as con:
        assert con.sql("select count(*) from hub_accounts").fetchall() == [(2,)]


def test_missing_snapshot_is_a_clear_error(tmp_path):
    paths = RunPaths.create(tmp_path, SNAPSHOT_DATE, "nothing")
    with pytest.raises(RunNotFoundError, match="run freeze_snapshot first"):
        build_models(paths, settings_for(tmp_path))


def test_a_snapshot_frozen_before_the_in_degrees_says_so(tmp_path):
    """A run frozen by a version before ``in_degrees`` (its manifest, no in_degrees.parquet),
    built after an upgrade: the error names the earlier version and the remedy (freeze it
    again: the retained snapshot is reused and its in-degrees counted), not "incomplete"."""
    paths = RunPaths.create(tmp_path, SNAPSHOT_DATE, "inflight")
    write_snapshot(paths)
    (paths.snapshot_dir / in_degrees.FILE).unlink()
    paths.snapshot_manifest.write_text("{}")
    with pytest.raises(RunNotFoundError) as caught:
        build_models(paths, settings_for(tmp_path))
    assert str(caught.value) == (
        f"the snapshot of run inflight ({SNAPSHOT_DATE}) at {paths.snapshot_dir} was frozen by "
        "an earlier version of recs, before the freeze counted the in-degrees (no "
        "in_degrees.parquet): run freeze_snapshot again (clear that task); it reuses the date's "
        "retained snapshot and counts them from its edges"
    )


@pytest.mark.slow
def test_rerun_overwrites_with_identical_bytes(built_run):
    paths, summary = built_run

    def digest() -> dict[str, str]:
        return {
            str(f.relative_to(paths.exports_dir)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(paths.exports_dir.rglob("*.parquet"))
        }

    before = digest()
    (paths.exports_dir / "stale.parquet").write_bytes(b"left over by an earlier attempt")
    again = build_models(paths, settings_for(paths.home))
    assert digest() == before
    assert again["rows"] == summary["rows"]


@pytest.mark.slow
def test_docs_generate_on_a_built_run(built_run):
    """The Makefile's `dbt docs generate --vars '{run_dir: ...}'`: the catalog sees the run."""
    from dbt.cli.main import dbtRunner

    paths, _ = built_run
    try:
        args = dbt_args("docs generate", paths, settings_for(paths.home), "--quiet")
        outcome = dbtRunner().invoke(args)
    finally:
        release_duckdb()
    assert outcome.success, outcome.exception
    catalog = outcome.result.to_dict()["nodes"]
    assert {"model.recs.popularity_index", "model.recs.export_eligible_users"} <= set(catalog)
    columns = catalog["model.recs.hub_accounts"]["columns"]
    assert set(columns) == {"user_id", "in_degree", "hub_threshold"}


@pytest.mark.slow
def test_dbt_docs_serve_ends_with_one_line_and_its_exit_code(built_run):
    """(From a review.) dbt logs whatever ends ``dbt docs serve`` with a traceback, Ctrl-C and
    SIGTERM included, and returns it: ``recs dbt-docs --serve`` on a port in use printed a
    traceback and exited 0, and SIGTERM printed one. Now a port in use is one line, exit 2;
    SIGTERM once the docs are served is ``recs: terminated``, exit 143; neither prints a
    traceback. Real processes, real sockets."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from recs.files import write_json

    paths, _ = built_run
    write_json(paths.snapshot_manifest, {"settings": settings_for(paths.home).model_dump(
        mode="json")})  # fmt: skip
    env = {**os.environ, "RECS_HOME": str(paths.home)}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        command = [sys.executable, "-m", "recs.cli", "dbt-docs", "--snapshot-date",
                   SNAPSHOT_DATE, "--run-id", "test", "--serve", "--port", str(port)]  # fmt: skip
        taken = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert taken.returncode == 2, taken.stderr
    assert taken.stderr.strip().splitlines()[-1] == (
        f"recs: error: cannot serve the docs on port {port}: Address already in use (choose "
        "another with --port)"
    )
    assert "Traceback" not in taken.stdout + taken.stderr
    assert "generating dbt docs" not in taken.stderr  # found before ~10 s of generating

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command[-1] = str(port)
    command.append("--json")  # one document on stdout: dbt's banner goes to stderr
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, process.communicate()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as page:
                    assert page.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "the docs were never served"
                time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, err
    assert err.strip().splitlines()[-1] == "recs: terminated"
    assert "Traceback" not in out + err
    assert json.loads(out)["static_index"].endswith("static_index.html")
    assert f"Serving docs at {port}" in err


def test_unit_tests_pass_on_a_built_run(built_run):
    """The nightly build leaves the unit tests out (``NIGHTLY_BUILD_FLAGS``); here, in CI, dbt
    runs every one of them (8: two intermediate, six marts) on the fixture's build."""
    from dbt.cli.main import dbtRunner

    paths, _ = built_run
    try:
        args = dbt_args(
            "test", paths, settings_for(paths.home), "--select", "test_type:unit", "--quiet",
            target="unit_tests",
        )  # fmt: skip
        outcome = dbtRunner().invoke(args)
    finally:
        release_duckdb()
    assert outcome.result is not None, outcome.exception
    ran = {str(r.node.unique_id): str(r.status) for r in outcome.result.results}
    expected = {
        "int_exclusions_unioned.int_exclusions_unioned_every_reason",
        "int_user_in_degrees_counted.int_user_in_degrees_counted_every_account",
        "hub_accounts.hub_accounts_fixed_threshold",
        "hub_accounts.hub_accounts_threshold_scales_to_graph",
        "hub_accounts.hub_accounts_threshold_floor",
        "eligible_users.eligible_users_active_in_window",
        "popularity_index.popularity_index_ranks_per_tag_and_global",
        "popularity_index.popularity_index_leaves_out_accounts_nobody_follows",
    }
    assert ran == {f"unit_test.recs.{name}": "pass" for name in expected}  # names a failure
    assert outcome.success


@pytest.mark.slow
def test_empty_exports_are_empty_files_not_null_rows(tmp_path):
    """Everyone dormant and a threshold nobody reaches: no eligible users and no hubs.

    hub_accounts.parquet must hold zero rows with the contract's columns (dbt-duckdb 1.11.1 would
    write one all-NULL row, see macros/materializations/external.sql), and eligible_users/ is an
    empty folder, not a shard_id=__HIVE_DEFAULT_PARTITION__ folder holding a NULL user.
    """
    paths = RunPaths.create(tmp_path, SNAPSHOT_DATE, "quiet")
    dormant = [(uid, "2026-01-01 00:00:00", *rest) for uid, _, *rest in USERS]
    write_snapshot(paths, users=dormant)
    summary = build_models(paths, settings_for(tmp_path, hub_threshold=1000))
    assert summary["rows"]["hub_accounts"] == 0 and summary["rows"]["eligible_users"] == 0
    hubs = pl.read_parquet(paths.exports_dir / "hub_accounts.parquet")
    assert hubs.height == 0
    check_schema(hubs.schema, EXPORT_SCHEMAS["hub_accounts"], "hub_accounts")
    assert list((paths.exports_dir / "eligible_users").iterdir()) == []
    assert summary["rows"]["follow_exclusions"] == 8


@pytest.mark.slow
def test_failed_build_names_the_failed_nodes(tmp_path):
    """An account status outside the store's three makes the accepted_values test fail."""
    paths = RunPaths.create(tmp_path, SNAPSHOT_DATE, "bad")
    write_snapshot(paths, users=USERS + [(10, "2026-11-01 00:00:00", "banned", True, False)])
    with pytest.raises(ModelsBuildError) as caught:
        build_models(paths, settings_for(tmp_path))
    message = str(caught.value)
    assert isinstance(caught.value, RecsError)
    assert "\n" not in message
    assert "test.recs.accepted_values_stg_users_account_status" in message
    assert str(paths.run_dir / "dbt" / "logs" / "dbt.log") in message


@pytest.mark.slow
def test_the_build_passes_within_a_small_memory_limit_and_counts_in_degrees(tmp_path):
    """A 20 k-user synthetic graph (about 600 k follows) built with DuckDB's memory limit at
    40 MB (10 MB runs out of memory: the limit is applied) passes, and the in-degrees it
    exports (count(*) per followee) sum to the snapshot's active follows of known accounts,
    counted here with Polars. (A spill across dbt's threads is exercised by make bench-scale:
    setting temp_directory in the profile failed there, "Cannot switch temporary directory".)"""
    from recs.config import Settings
    from recs.demo.synthetic import generate_graph
    from recs.nightly import pipeline

    home = tmp_path / "home"
    settings = Settings(home=home, shard_count=4, duckdb_memory_limit="40MB")
    generate_graph(20_000, 7, settings, avg_out_degree=30)
    paths = RunPaths.create(home, "2026-11-01", "spill")
    pipeline.freeze_snapshot(paths, settings)
    summary = pipeline.build_models(paths)
    assert summary["tests_passed"] == data_test_count(paths) > 80 and summary["tests_warned"] == 0
    edges = pl.read_parquet(paths.snapshot_dir / "follow_edges" / "*" / "*.parquet")
    users = pl.read_parquet(paths.snapshot_dir / "users.parquet", columns=["user_id"])
    active = edges.filter(
        (pl.col("status") == "active") & pl.col("followee_id").is_in(users["user_id"].implode())
        & (pl.col("follower_id") != pl.col("followee_id"))
    )
    profiles = pl.read_parquet(paths.exports_dir / "candidate_profiles.parquet")
    assert profiles["in_degree"].sum() == active.height > 500_000
