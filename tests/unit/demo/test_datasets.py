"""recs.demo: parsing the real files, the generated fields, writing the live store."""

from __future__ import annotations

import datetime as dt
import gzip
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from recs.config import Settings
from recs.demo import datasets, generated
from recs.demo.datasets import (
    DATASETS,
    dataset_folders,
    dataset_path,
    load_dataset,
    read_edges,
)
from recs.demo.follow_graph import FollowGraph
from recs.demo.generated import (
    GENERATED_FIELDS,
    REFERENCE_END,
    generate_interests,
    generate_relationships,
    generate_user_attributes,
)
from recs.demo.synthetic import synthetic_follow_graph
from recs.errors import DatasetError, RecsError
from recs.store import bulk, schema
from recs.store.connections import engine_for

END_S = int((REFERENCE_END - dt.datetime(1970, 1, 1)).total_seconds())
DAY_S = 86_400

# SNAP-style: '#' header, CRLF line ends (as in the real soc-Slashdot0902 file), tabs.
TINY_SLASHDOT = (
    "# Directed graph (each unordered pair of nodes is saved once): tiny.txt \r\n"
    "# Nodes: 6 Edges: 9\r\n"
    "# FromNodeId\tToNodeId\r\n"
    "0\t0\r\n0\t1\r\n0\t2\r\n1\t0\r\n1\t1\r\n2\t3\r\n3\t4\r\n4\t4\r\n5\t5\r\n"
)
# Twitter-style: file columns are (src = followee, trg = follower).
TINY_TWITTER = "# tiny twitter graph\n# src\ttrg\n1\t2\n1\t3\n4\t1\n"


def write_gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt", encoding="utf-8", newline="") as handle:
        handle.write(text)
    return path


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    write_gz(tmp_path / DATASETS["slashdot"].filename, TINY_SLASHDOT)
    write_gz(tmp_path / DATASETS["twitter-bofa"].filename, TINY_TWITTER)
    return Settings(home=tmp_path / "home", datasets_dir=tmp_path)


def rows(settings: Settings, sql: str) -> list[tuple]:
    connection = sqlite3.connect(settings.home / "live.db")
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def dump(settings: Settings) -> dict[str, list[tuple]]:
    """Every row of every store table, in a fixed order."""
    return {
        table: rows(settings, f"SELECT * FROM {table} ORDER BY 1, 2")
        for table in ("users", "follow_edges", "blocks", "mutes", "dismissed_candidates")
    } | {"user_interests": rows(settings, "SELECT * FROM user_interests ORDER BY 1, 2")}


def test_unknown_dataset_names_the_available_ones(settings):
    with pytest.raises(DatasetError, match="slashdot, twitter-bofa, twitter-hershey"):
        load_dataset("friendster", settings)


def test_missing_file_names_every_folder_searched(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "BUNDLED_DATASETS", tmp_path / "bundled")
    monkeypatch.setattr(datasets, "SHARED_DATASETS", tmp_path / "shared")
    settings = Settings(home=tmp_path / "home", datasets_dir=tmp_path / "nowhere")
    with pytest.raises(DatasetError) as raised:
        load_dataset("slashdot", settings)
    message = str(raised.value)
    assert "soc-Slashdot0902.txt.gz not found in" in message
    for folder in ("nowhere", "bundled", "shared"):
        assert str(tmp_path / folder) in message
    assert issubclass(DatasetError, RecsError)


def test_the_bundled_files_are_found_without_shared_datasets(tmp_path, monkeypatch):
    """A fresh clone: nothing beside the repository, no RECS_DATASETS_DIR."""
    monkeypatch.setattr(datasets, "SHARED_DATASETS", tmp_path / "no-shared")
    monkeypatch.delenv("RECS_DATASETS_DIR", raising=False)
    settings = Settings(home=tmp_path / "home")
    assert settings.datasets_dir == datasets.BUNDLED_DATASETS
    for name, spec in DATASETS.items():
        assert dataset_path(name, settings) == datasets.BUNDLED_DATASETS / spec.filename


def test_recs_datasets_dir_is_searched_first_and_shared_datasets_last(tmp_path, monkeypatch):
    first, shared = tmp_path / "first", tmp_path / "shared"
    for folder in (first, shared):
        folder.mkdir()
    write_gz(first / DATASETS["slashdot"].filename, TINY_SLASHDOT)
    monkeypatch.setattr(datasets, "BUNDLED_DATASETS", tmp_path / "bundled-missing")
    monkeypatch.setattr(datasets, "SHARED_DATASETS", shared)
    write_gz(shared / DATASETS["twitter-bofa"].filename, TINY_TWITTER)
    settings = Settings(home=tmp_path / "home", datasets_dir=first)
    assert dataset_folders(settings) == [first, tmp_path / "bundled-missing", shared]
    assert dataset_path("slashdot", settings) == first / DATASETS["slashdot"].filename
    assert dataset_path("twitter-bofa", settings) == shared / DATASETS["twitter-bofa"].filename


def test_bundled_files_are_the_ones_their_readme_lists():
    """datasets/README.md gives each file's sha256; the copies must be those bytes."""
    from recs.files import sha256_file

    readme = (datasets.BUNDLED_DATASETS / "README.md").read_text()
    listed = dict(
        (name, digest)
        for digest, name in (
            line.split() for line in readme.splitlines() if len(line.split()) == 2
            and len(line.split()[0]) == 64
        )
    )
    assert set(listed) == {p.name for p in datasets.BUNDLED_DATASETS.glob("*.gz")}
    assert {spec.filename for spec in DATASETS.values()} <= set(listed)
    for name, digest in listed.items():
        assert sha256_file(datasets.BUNDLED_DATASETS / name) == digest, name


def test_malformed_file_is_a_dataset_error(tmp_path):
    write_gz(tmp_path / DATASETS["slashdot"].filename, "# header\n0\tzero\n")
    with pytest.raises(DatasetError, match="does not parse"):
        read_edges("slashdot", Settings(home=tmp_path, datasets_dir=tmp_path))


def test_slashdot_loads_every_edge_active_and_drops_self_loops(settings):
    """TINY_SLASHDOT has 9 edge lines; 0-0, 1-1, 4-4 and 5-5 are self-loops (4 dropped).

    The 5 others are the active follows, unchanged: 0->1, 0->2, 1->0, 2->3, 3->4. Users are
    every node id of the file, 0..5 (5 only has a self-loop but is still an account).
    """
    parsed = read_edges("slashdot", settings)
    assert parsed.edges.rows() == [(0, 1), (0, 2), (1, 0), (2, 3), (3, 4)]
    assert parsed.user_ids.tolist() == [0, 1, 2, 3, 4, 5]
    summary = load_dataset("slashdot", settings)
    assert summary["self_loops_dropped"] == 4
    assert summary["duplicates_dropped"] == 0
    assert summary["users"] == 6
    assert summary["follow_edges"] == 5
    assert rows(settings, "SELECT user_id FROM users ORDER BY 1") == [(i,) for i in range(6)]
    active = rows(
        settings,
        "SELECT follower_id, followee_id FROM follow_edges WHERE status = 'active' ORDER BY 1, 2",
    )
    assert active == [(0, 1), (0, 2), (1, 0), (2, 3), (3, 4)]
    pending = rows(
        settings, "SELECT follower_id, followee_id FROM follow_edges WHERE status = 'pending'"
    )
    assert len(pending) == summary["pending_follows"]
    assert all(pair not in active and pair[0] != pair[1] for pair in pending)
    assert summary["generated_fields"] == list(GENERATED_FIELDS)


def test_twitter_columns_are_reversed(settings):
    """TINY_TWITTER lines (src, trg) = (1,2), (1,3), (4,1) with src = the account followed.

    So the follows (follower -> followee) are 2->1, 3->1 and 1->4.
    """
    messages: list[str] = []
    summary = load_dataset("twitter-bofa", settings, progress=messages.append)
    assert summary["follow_edges"] == 3
    assert "follow_edges: 3/3 rows" in messages  # progress(message), as the CLI expects
    active = rows(
        settings,
        "SELECT follower_id, followee_id FROM follow_edges WHERE status = 'active' ORDER BY 1, 2",
    )
    assert active == [(1, 4), (2, 1), (3, 1)]


def test_duplicate_lines_are_counted_and_loaded_once(tmp_path):
    write_gz(tmp_path / DATASETS["slashdot"].filename, "0\t1\n0\t1\n1\t0\n")
    parsed = read_edges("slashdot", Settings(home=tmp_path, datasets_dir=tmp_path))
    assert parsed.duplicates_dropped == 1
    assert parsed.edges.rows() == [(0, 1), (1, 0)]


def test_non_empty_store_needs_replace(settings):
    load_dataset("slashdot", settings)
    before = dump(settings)
    with pytest.raises(DatasetError, match="not empty.*--replace"):
        load_dataset("twitter-bofa", settings)
    assert dump(settings) == before
    summary = load_dataset("twitter-bofa", settings, replace=True)
    assert rows(settings, "SELECT count(*) FROM users") == [(summary["users"],)]


@pytest.mark.parametrize("path", ["adbc", "sqlalchemy"])
def test_an_interrupted_replace_leaves_the_store_as_it_was(settings, monkeypatch, path):
    """(From a newcomer: Ctrl-C during ``load-dataset slashdot --replace`` left an empty store,
    5 of 5 times: the schema was dropped in a transaction of its own before the load.) The
    load is interrupted as it starts on its rows, after ``replace`` emptied the tables: every
    row is still there, on the ADBC path and on SQLAlchemy's."""

    def interrupted():
        raise KeyboardInterrupt  # Ctrl-C while the first table's rows are made
        yield

    load_dataset("slashdot", settings)
    before = dump(settings)
    assert before["users"] and before["follow_edges"]
    if path == "sqlalchemy":
        monkeypatch.setattr(bulk, "_use_sqlite_bulk_path", lambda url: False)
    with pytest.raises(KeyboardInterrupt):
        bulk.write_store(settings.live_store_url, interrupted(), replace=True)
    assert dump(settings) == before


def test_an_interrupted_replace_leaves_a_postgresql_store_as_it_was(settings, postgres_url):
    """The same on PostgreSQL (ADBC ``COPY``; ``replace`` is one ``TRUNCATE`` in the load's
    transaction)."""
    from sqlalchemy import text

    def interrupted():
        raise KeyboardInterrupt
        yield

    def counts() -> tuple[int, ...]:
        engine = engine_for(postgres_url)
        try:
            with engine.connect() as connection:
                return tuple(
                    connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
                    for table in ("users", "follow_edges", "follow_edges_reverse")
                )
        finally:
            engine.dispose()

    on_postgres = Settings(home=settings.home, datasets_dir=settings.datasets_dir,
                           store_url=postgres_url)  # fmt: skip
    assert on_postgres.live_store_url == postgres_url
    load_dataset("slashdot", on_postgres)
    before = counts()
    assert min(before) > 0
    with pytest.raises(KeyboardInterrupt):
        bulk.write_store(postgres_url, interrupted(), replace=True)
    assert counts() == before
    summary = load_dataset("twitter-bofa", on_postgres, replace=True)  # then one that goes
    users, edges, reverse = counts()
    assert users == summary["users"]
    assert edges == reverse == summary["follow_edges"] + summary["pending_follows"]


def test_same_seed_gives_the_same_rows(tmp_path, settings):
    load_dataset("slashdot", settings)
    other = Settings(home=tmp_path / "other", datasets_dir=settings.datasets_dir)
    load_dataset("slashdot", other)
    assert dump(settings) == dump(other)


def test_timestamps_are_stored_as_sqlalchemy_datetime_text(settings):
    """SQLAlchemy reads back what the bulk path wrote (same text format)."""
    from sqlalchemy import select

    load_dataset("slashdot", settings)
    engine = engine_for(settings.live_store_url)
    with engine.connect() as connection:
        created = connection.execute(select(schema.users.c.created_at)).scalars().all()
    engine.dispose()
    assert all(isinstance(value, dt.datetime) for value in created)
    assert max(created) < REFERENCE_END


def test_sqlalchemy_path_writes_the_same_rows_as_the_bulk_path(tmp_path, settings, monkeypatch):
    load_dataset("slashdot", settings)
    monkeypatch.setattr(bulk, "_use_sqlite_bulk_path", lambda url: False)
    generic = Settings(home=tmp_path / "generic", datasets_dir=settings.datasets_dir)
    load_dataset("slashdot", generic)
    assert dump(generic) == dump(settings)


def test_generated_user_attributes_have_the_documented_mix():
    """Shares from the module constants; tolerances are ~5 standard errors at n = 200 k."""
    n = 200_000
    users = generate_user_attributes(n, seed=11)
    age = END_S - users.created_s
    idle = END_S - users.last_active_s
    assert (users.created_s <= users.last_active_s).all()
    assert (users.last_active_s < END_S).all()
    assert (age < DAY_S).mean() == pytest.approx(generated.NEW_ACCOUNT_SHARE, abs=0.001)
    assert (idle > 30 * DAY_S).mean() == pytest.approx(generated.DORMANT_SHARE, abs=0.02)
    assert (idle < 7 * DAY_S).mean() > 0.5  # most active within days
    assert (users.status_code == 1).mean() == pytest.approx(generated.SUSPENDED_SHARE, abs=0.002)
    assert (users.status_code == 2).mean() == pytest.approx(generated.DEACTIVATED_SHARE, abs=0.002)
    assert users.is_discoverable.mean() == pytest.approx(generated.DISCOVERABLE_SHARE, abs=0.003)
    assert users.is_private.mean() == pytest.approx(generated.PRIVATE_SHARE, abs=0.003)
    again = generate_user_attributes(n, seed=11)
    assert np.array_equal(users.last_active_s, again.last_active_s)


def test_interests_are_one_to_three_distinct_tags_per_user():
    users, tags = generate_interests(10_000, seed=5)
    per_user = np.bincount(users, minlength=10_000)
    assert per_user.min() == 1 and per_user.max() == 3
    assert len(set(zip(users.tolist(), tags.tolist(), strict=True))) == len(users)
    assert set(tags.tolist()) == set(range(len(generated.INTEREST_TAGS)))


def friends_of_friends(graph: FollowGraph, user: int) -> set[int]:
    return (
        {
            int(candidate)
            for friend in graph.followees(user)
            for candidate in graph.followees(int(friend))
        }
        - set(graph.followees(user).tolist())
        - {user}
    )


def test_relationships_land_on_friends_of_friends():
    """RELATIONSHIPS says 70 % of dismissals and 50 % of blocks are friend-of-friend pairs.

    Random pairs are rarely friends-of-friends on a 3,000-user graph, so the observed share is
    at least those numbers; blocks alternate direction, so both directions occur.
    """
    graph = synthetic_follow_graph(3_000, seed=2, avg_out_degree=10)
    users = generate_user_attributes(graph.n_users, seed=2)
    generated = generate_relationships(graph, users, seed=2)
    dismissed = generated["dismissed_candidates"]
    assert len(dismissed) == 24  # round(0.008 * 3000)
    on_fof = [
        c in friends_of_friends(graph, u)
        for u, c in zip(dismissed.left.tolist(), dismissed.right.tolist(), strict=True)
    ]
    assert np.mean(on_fof) >= 0.7
    blocks = generated["blocks"]
    blocker_side = sum(
        b in friends_of_friends(graph, a)
        for a, b in zip(blocks.left.tolist(), blocks.right.tolist(), strict=True)
    )
    blocked_side = sum(
        a in friends_of_friends(graph, b)
        for a, b in zip(blocks.left.tolist(), blocks.right.tolist(), strict=True)
    )
    assert blocker_side >= 2 and blocked_side >= 2
    pending = generated["pending_follows"]
    assert len(pending) == 15
    for follower, followee in zip(pending.left.tolist(), pending.right.tolist(), strict=True):
        assert follower != followee and not graph.has_edge(follower, followee)
    for rows_ in generated.values():
        assert (rows_.at_s < END_S).all()
        assert (
            rows_.at_s >= np.maximum(users.created_s[rows_.left], users.created_s[rows_.right])
        ).all()


def test_pending_requests_are_never_existing_follows_even_on_a_dense_graph():
    """40 users x 35 follows: 35/39 = 90 % of all pairs are follows, so a random pair is
    almost always an edge; the generated pending request must still never be one."""
    for seed in range(10):
        graph = synthetic_follow_graph(40, seed=seed, avg_out_degree=35)
        users = generate_user_attributes(graph.n_users, seed=seed)
        pending = generate_relationships(graph, users, seed=seed)["pending_follows"]
        assert len(pending) == 1  # max(1, round(0.005 * 40))
        for follower, followee in zip(pending.left.tolist(), pending.right.tolist(), strict=True):
            assert follower != followee and not graph.has_edge(follower, followee)


@pytest.mark.slow
def test_real_slashdot_loads_82168_users_and_870161_active_follows(tmp_path):
    """The datasets README: 82,168 nodes, 948,464 edge lines of which 78,303 self-loops.

    948,464 - 78,303 = 870,161 active follows; the generated pending requests are extra rows.
    """
    settings = Settings(home=tmp_path)
    summary = load_dataset("slashdot", settings)
    assert summary["users"] == 82_168
    assert summary["self_loops_dropped"] == 78_303
    assert summary["follow_edges"] == 870_161
    by_status = dict(rows(settings, "SELECT status, count(*) FROM follow_edges GROUP BY status"))
    assert by_status == {"active": 870_161, "pending": summary["pending_follows"]}
    assert 0 < summary["pending_follows"] < 1_000
    assert rows(settings, "SELECT count(*) FROM users") == [(82_168,)]
    assert rows(settings, "SELECT count(*) FROM follow_edges WHERE follower_id = followee_id") == [
        (0,)
    ]
