"""The capped CSR graph (recs.traversal.graph, its rows: recs.traversal.capped_rows) and its id map
(recs.traversal.ids)."""

from __future__ import annotations

import datetime as dt
import shutil
import threading

import numpy as np
import polars as pl
import pytest
from traversal_fixtures import (
    AS_OF,
    Fixture,
    User,
    recount_in_degrees,
    settings_for,
    users_with,
    write_run,
)

from recs.contracts import IN_DEGREES_FILE, SNAPSHOT_SCHEMAS
from recs.errors import CorruptFileError, RunNotFoundError, SchemaMismatchError
from recs.files import read_json, write_json
from recs.sampling import capped_follows, sample_keys
from recs.traversal import capped_rows
from recs.traversal.capped_rows import sample_sorted
from recs.traversal.graph import build_graph, load_graph
from recs.traversal.ids import DenseIndex

SEED = 20_240_601

# Users 1..5; 99 is not in users. Over two shards (shard_of: 1,4,5 -> 1; 2,3,99 -> 0).
EDGES = [
    (1, 2, "active"), (1, 3, "active"), (1, 4, "active"), (1, 5, "active"),
    (2, 3, "active"), (2, 99, "active"), (2, 4, "pending"),
    (3, 3, "active"),
    (99, 1, "active"),
    (5, 1, "active"),
]


def graph_files(graph_dir) -> dict[str, bytes]:
    """Every file of a built graph by name, its bytes; ``meta.json`` without ``plan_sha256``,
    the one field that differs between plans of the same snapshot and settings (each plan has
    an id of its own, ``graph_pieces.plan_pieces``)."""
    import json

    files = {p.name: p.read_bytes() for p in sorted(graph_dir.iterdir())}
    meta = json.loads(files["meta.json"])
    assert len(meta.pop("plan_sha256")) == 64
    files["meta.json"] = json.dumps(meta, sort_keys=True).encode()
    return files



def tiny_graph(tmp_path, hop2_cap=3):
    settings = settings_for(tmp_path, shard_count=2, hop2_cap=hop2_cap)
    paths = write_run(Fixture(users=users_with([5, 3, 1, 4, 2]), edges=EDGES), settings)
    return paths, settings


def test_build_graph_caps_rows_in_sample_order(tmp_path):
    """Dense ids are positions in sorted users [1..5], so dense = id - 1.

    Row 1: user 1's active follows 2,3,4,5 in sample order are 3, 4, 5, 2 (the order
    ``capped_follows`` gives; pinned by test_sampling), capped at hop2_cap=3 -> 3, 4, 5.
    Row 2: 2->3 kept; 2->99 dropped (99 not in users); 2->4 pending, not expanded -> [3].
    Row 3: 3->3 is a self-follow, dropped -> []. Row 4: no follows -> [].
    Row 5: 5->1 -> [1]. The edge 99->1 is dropped (unknown follower).
    Counts: 10 read, 1 pending, 2 unknown endpoint, 1 self-loop, 1 row capped, 5 kept.
    """
    paths, settings = tiny_graph(tmp_path)
    assert capped_follows(1, [2, 3, 4, 5], 4, SEED) == [3, 4, 5, 2]
    result = build_graph(paths, settings)
    graph = load_graph(paths.graph_dir)
    assert graph.user_ids.tolist() == [1, 2, 3, 4, 5]
    assert graph.indptr.tolist() == [0, 3, 4, 4, 4, 5]
    assert (graph.user_ids[graph.indices]).tolist() == [3, 4, 5, 3, 1]
    assert graph.follows(1) == [3, 4, 5]
    assert graph.follows(99) == []
    assert result["n_edges"] == 5 and result["n_nodes"] == 5
    meta = read_json(paths.graph_dir / "meta.json")
    assert {k: meta[k] for k in (
        "edges_read", "pending_skipped", "unknown_endpoint_dropped", "self_loops_dropped",
        "duplicates_dropped", "rows_capped", "max_row_length", "hop2_cap", "sample_seed",
    )} == {
        "edges_read": 10, "pending_skipped": 1, "unknown_endpoint_dropped": 2,
        "self_loops_dropped": 1, "duplicates_dropped": 0, "rows_capped": 1,
        "max_row_length": 3, "hop2_cap": 3, "sample_seed": SEED,
    }
    assert meta["partitions"] == [0, 1]


def test_hop2_cap_one_keeps_the_first_in_sample_order(tmp_path):
    """With hop2_cap=1 row 1 is just [3], the first of 3, 4, 5, 2."""
    paths, settings = tiny_graph(tmp_path, hop2_cap=1)
    build_graph(paths, settings)
    graph = load_graph(paths.graph_dir)
    assert graph.follows(1) == [3]
    assert graph.indptr.tolist() == [0, 1, 2, 2, 2, 3]


def test_graph_is_memory_mapped_read_only(tmp_path):
    paths, settings = tiny_graph(tmp_path)
    build_graph(paths, settings)
    graph = load_graph(paths.graph_dir)
    for array in (graph.user_ids, graph.indptr, graph.indices, graph.activity, graph.index.table):
        assert isinstance(array, np.memmap)
        assert not array.flags.writeable
    assert graph.indices.dtype == np.int32 and graph.indptr.dtype == np.int64


def test_activity_is_the_candidate_signal_per_node(tmp_path):
    """Users 1..5 (dense 0..4), as_of = 2026-11-02 00:00, half-life 14 days:
    1 active at as_of -> 1.0; 2 active 14 days earlier -> 0.5; 3 suspended -> NaN (not
    recommendable); 4 never active (null last_active_at) -> 0.0; 5 has no candidate profile
    -> NaN. Recorded in meta: as_of, half_life_days, 3 recommendable nodes."""
    settings = settings_for(tmp_path, shard_count=2)
    users = [
        User(1), User(2, last_active_at=AS_OF - dt.timedelta(days=14)),
        User(3, account_status="suspended"), User(4, last_active_at=None), User(5),
    ]
    paths = write_run(Fixture(users=users, edges=EDGES, missing_profiles={5}), settings)
    build_graph(paths, settings)
    graph = load_graph(paths.graph_dir)
    assert graph.activity.tolist()[:2] == [1.0, 0.5]
    assert np.isnan(graph.activity[2]) and graph.activity[3] == 0.0
    assert np.isnan(graph.activity[4])
    assert graph.meta["as_of"] == "2026-11-02T00:00:00"
    assert graph.meta["half_life_days"] == 14.0
    assert graph.meta["recommendable_nodes"] == 3
    # the same as one bit per node: dense 0, 1 and 3 (users 1, 2 and 4)
    assert graph.recommendable.tolist() == [0b01011]


def test_sparse_ids_persist_a_hash_index(tmp_path):
    """Ids spread over 10**12 cannot use a lookup table: the graph stores the hash table and
    load_graph maps it back (memory-mapped, not rebuilt); lookups equal positions."""
    ids = [10**12 * k + 7 for k in range(1, 6)]
    settings = settings_for(tmp_path, shard_count=2)
    edges = [(ids[0], ids[1], "active"), (ids[1], ids[2], "active")]
    paths = write_run(Fixture(users=users_with(ids), edges=edges), settings)
    build_graph(paths, settings)
    graph = load_graph(paths.graph_dir)
    assert graph.meta["id_index"]["kind"] == "hash"
    assert isinstance(graph.index.hashed[0], np.memmap)
    assert graph.dense_ids([ids[3], ids[0], 5, ids[4]]).tolist() == [3, 0, -1, 4]
    assert graph.follows(ids[0]) == [ids[1]]


def test_old_graph_format_must_be_rebuilt(tmp_path):
    paths, settings = tiny_graph(tmp_path)
    build_graph(paths, settings)
    meta = read_json(paths.graph_dir / "meta.json")
    write_json(paths.graph_dir / "meta.json", {**meta, "format_version": 1})
    with pytest.raises(SchemaMismatchError, match="rerun build_graph"):
        load_graph(paths.graph_dir)


def test_rebuild_writes_identical_bytes(tmp_path):
    paths, settings = tiny_graph(tmp_path)
    build_graph(paths, settings)
    first = graph_files(paths.graph_dir)
    build_graph(paths, settings)
    second = graph_files(paths.graph_dir)
    assert first == second
    assert sorted(first) == [
        "account_active.npy", "activity.npy", "id_index.npy", "in_degree.npy", "indices.npy",
        "indptr.npy", "meta.json", "path_weight.npy", "reciprocal_pairs.npy",
        "recommendable.npy", "user_ids.npy",
    ]


def test_follower_split_across_partitions_is_capped_once(tmp_path):
    """Not the snapshot's layout, but harmless: user 1's follows split over two files of its
    partition (2, 3 in one; 4, 5 and a duplicate 1->3 in another) still give row 1 = [3, 4,
    5]."""
    from recs.sharding import shard_of

    paths, settings = tiny_graph(tmp_path)
    extra = pl.DataFrame(
        {"follower_id": [1, 1, 1], "followee_id": [4, 5, 3], "created_at": [None] * 3,
         "status": ["active"] * 3},
        schema=SNAPSHOT_SCHEMAS["follow_edges"],
    )
    home = shard_of(1, settings.shard_count)
    part = paths.snapshot_dir / "follow_edges" / f"shard_id={home:03d}" / "part-1.parquet"
    extra.write_parquet(part)
    recount_in_degrees(paths)
    build_graph(paths, settings)
    graph = load_graph(paths.graph_dir)
    assert graph.follows(1) == [3, 4, 5]
    assert graph.follows(2) == [3]
    assert graph.meta["duplicates_dropped"] == 3  # 1->4, 1->5, 1->3 each seen twice


def test_load_graph_errors(tmp_path):
    paths, settings = tiny_graph(tmp_path)
    with pytest.raises(RunNotFoundError, match="indices.npy|user_ids.npy"):
        load_graph(paths.graph_dir)
    build_graph(paths, settings)
    meta = read_json(paths.graph_dir / "meta.json")
    write_json(paths.graph_dir / "meta.json", {**meta, "n_edges": meta["n_edges"] + 1})
    with pytest.raises(SchemaMismatchError, match="indices"):
        load_graph(paths.graph_dir)
    write_json(paths.graph_dir / "meta.json", meta)
    np.save(paths.graph_dir / "recommendable.npy", np.zeros(2, dtype=np.uint8))  # 5 nodes: 1
    with pytest.raises(SchemaMismatchError, match="recommendable uint8"):
        load_graph(paths.graph_dir)


def test_a_damaged_graph_file_is_one_error_not_a_crash(tmp_path):
    """(From a review: a traceback, an abort or a segfault in ``recs shard run``.) A graph file
    cut short, and ids out of range in indices, indptr or the id table (the compiled kernel
    checks no bounds), are ``CorruptFileError``s naming what to rerun."""
    paths, settings = tiny_graph(tmp_path)
    build_graph(paths, settings)
    graph_dir = paths.graph_dir
    saved = {name: np.load(graph_dir / name) for name in ("indices.npy", "indptr.npy")}
    indices = graph_dir / "indices.npy"
    whole = indices.read_bytes()
    indices.write_bytes(whole[:-2])
    with pytest.raises(CorruptFileError, match=r"indices.npy is unreadable .*rerun build_graph"):
        load_graph(graph_dir)
    damaged = {
        "indices.npy": saved["indices.npy"] + np.int32(1_000_000),
        "indptr.npy": saved["indptr.npy"][::-1].copy(),
    }
    for name, array in damaged.items():
        np.save(graph_dir / name, array)
        other = "indptr.npy" if name == "indices.npy" else "indices.npy"
        np.save(graph_dir / other, saved[other])
        with pytest.raises(CorruptFileError, match=rf"out of range \({name[:-4]}\)"):
            load_graph(graph_dir)
    np.save(graph_dir / "indptr.npy", saved["indptr.npy"])
    np.save(graph_dir / "indices.npy", saved["indices.npy"])
    table = np.load(graph_dir / "id_index.npy")
    np.save(graph_dir / "id_index.npy", np.where(table >= 0, table + 100, table).astype(np.int32))
    with pytest.raises(CorruptFileError, match=r"out of range \(id_index\)"):
        load_graph(graph_dir)


def test_missing_users_file_is_a_clear_error(tmp_path):
    paths, settings = tiny_graph(tmp_path)
    (paths.snapshot_dir / "users.parquet").unlink()
    with pytest.raises(RunNotFoundError, match="users.parquet"):
        build_graph(paths, settings)


@pytest.mark.parametrize("ids", [np.arange(1000) + 50, np.arange(1000) * 1_000_003 + 7])
def test_dense_index_table_and_hash_agree_with_binary_search(ids):
    """Compact ids use a lookup table, sparse ids a hash table; both must equal searchsorted."""
    index = DenseIndex(ids)
    assert (index.table is not None) == (ids[-1] - ids[0] < 10_000)
    rng = np.random.default_rng(3)
    queries = np.r_[rng.choice(ids, 500), rng.integers(-10, ids[-1] + 10, 500), [2**62]]
    pos = np.minimum(np.searchsorted(ids, queries), len(ids) - 1)
    expected = np.where(ids[pos] == queries, pos, -1)
    assert index(queries).tolist() == expected.tolist()
    assert DenseIndex(np.zeros(0, np.int64))(queries).tolist() == [-1] * len(queries)


def test_sample_sorted_equals_lexsort_and_handles_ties():
    rng = np.random.default_rng(5)
    groups = rng.integers(0, 50, 5000)
    followees = rng.integers(0, 10**9, 5000)
    keys = sample_keys(groups, followees, SEED)
    expected = np.lexsort((followees, keys, groups))
    assert sample_sorted(groups, 50, keys, followees).tolist() == expected.tolist()
    # duplicate pairs tie on the packed key: the exact fallback must still match lexsort
    groups2, followees2 = np.r_[groups, groups[:10]], np.r_[followees, followees[:10]]
    keys2 = sample_keys(groups2, followees2, SEED)
    order = sample_sorted(groups2, 50, keys2, followees2)
    expected2 = np.lexsort((followees2, keys2, groups2))
    assert groups2[order].tolist() == groups2[expected2].tolist()
    assert followees2[order].tolist() == followees2[expected2].tolist()


def test_indices_written_through_a_memory_map_are_np_save_bytes(tmp_path):
    """indices.npy is scattered into a memory map (the rows never sit in private memory):
    its bytes are exactly what np.save writes for the same array, and the spilled pieces are
    gone."""
    import io

    paths, settings = tiny_graph(tmp_path)
    build_graph(paths, settings)
    indices = np.load(paths.graph_dir / "indices.npy")
    assert indices.tolist() == [2, 3, 4, 2, 0]  # dense ids of 3, 4, 5 | 3 | 1
    saved = io.BytesIO()
    np.save(saved, indices, allow_pickle=False)
    assert (paths.graph_dir / "indices.npy").read_bytes() == saved.getvalue()
    assert not [p for p in paths.run_dir.iterdir() if p.name.startswith(".")]


def test_a_build_that_fails_half_way_leaves_no_graph_that_looks_built(tmp_path, monkeypatch):
    """The second partition cannot be read (truncated) on a rebuild: the error comes out, the
    previous meta.json is gone (so nothing loads a half-rewritten graph), and so are the spilled
    pieces."""
    paths, settings = tiny_graph(tmp_path)
    build_graph(paths, settings)
    part = sorted((paths.snapshot_dir / "follow_edges").glob("shard_id=*/*.parquet"))[-1]
    part.write_bytes(part.read_bytes()[:20])
    with pytest.raises(Exception):  # noqa: B017 - whatever Polars raises for a truncated file
        build_graph(paths, settings)
    assert not (paths.graph_dir / "meta.json").exists()
    with pytest.raises(Exception):  # noqa: B017
        load_graph(paths.graph_dir)
    assert not [p for p in paths.run_dir.iterdir() if p.name.startswith(".")]


def test_a_rebuild_removes_what_a_killed_build_left(tmp_path):
    """A build killed mid-way (SIGKILL: no cleanup runs) leaves a piece's temporary file and an
    array of a file the partition no longer has, and the memory-mapped indices' temporary file
    inside graph/: the next build removes them."""
    paths, settings = tiny_graph(tmp_path)
    build_graph(paths, settings)
    pieces = paths.run_dir / "graph_pieces"
    # a built graph leaves the plan, not the pieces (scratch twice the size of indices.npy)
    assert sorted(p.name for p in pieces.iterdir()) == ["plan.json", "reciprocal_pairs.npy"]
    piece = pieces / "shard_id=001"
    piece.mkdir()
    left = [piece / ".000.src.npy.999-dead.tmp", piece / "007.src.npy"]
    for path in left:
        path.write_bytes(b"x" * 1000)
    stale = paths.graph_dir / ".indices.npy.999-dead.tmp"
    stale.write_bytes(b"x" * 1000)
    build_graph(paths, settings)
    assert not stale.exists() and not any(path.exists() for path in left)
    assert load_graph(paths.graph_dir).follows(1) == [3, 4, 5]


def many_partitions(tmp_path):
    """400 users over 6 shards, 4,000 random follows (some pending, repeated pairs and
    self-follows, followees outside the users), hop2_cap 7: six partitions to cap."""
    rng = np.random.default_rng(11)
    followers = rng.integers(1, 401, 4_000)
    followees = rng.integers(1, 420, 4_000)
    status = np.where(rng.random(4_000) < 0.1, "pending", "active")
    edges = sorted(set(zip(followers.tolist(), followees.tolist(), status.tolist(), strict=True)))
    edges = list({(a, b): (a, b, c) for a, b, c in edges}.values())  # one status per pair
    settings = settings_for(tmp_path, shard_count=6, hop2_cap=7)
    paths = write_run(Fixture(users=users_with(range(1, 401)), edges=edges), settings)
    return paths, settings, edges


def test_partitions_capped_on_threads_give_the_bytes_of_one_thread(tmp_path, monkeypatch):
    """The six partitions capped one at a time, then two and three at once
    (``GRAPH_THREADS``): every file of the graph is the same, meta.json's counts included
    (each partition counts on its own thread and the counts are added), and the counts are the
    fixture's own: every edge read, the pending ones skipped, the followees outside users
    dropped."""
    paths, settings, edges = many_partitions(tmp_path)
    built = {}
    for threads in (1, 2, 3):
        monkeypatch.setattr(capped_rows, "GRAPH_THREADS", threads)
        build_graph(paths, settings)
        built[threads] = graph_files(paths.graph_dir)
    assert built[2] == built[1] and built[3] == built[1]
    meta = read_json(paths.graph_dir / "meta.json")
    pending = sum(status == "pending" for _, _, status in edges)
    outside = sum(
        status == "active" and followee > 400 and follower != followee
        for follower, followee, status in edges
    )
    assert meta["edges_read"] == len(edges)
    assert meta["pending_skipped"] == pending
    assert meta["unknown_endpoint_dropped"] == outside
    assert meta["partitions"] == [0, 1, 2, 3, 4, 5]


def test_two_partitions_are_capped_at_once(tmp_path, monkeypatch):
    """With ``GRAPH_THREADS`` 2 the first two partitions are in ``_capped_partition`` at the
    same time: each waits at a two-party barrier for the other (one thread would time out)."""
    paths, settings, _ = many_partitions(tmp_path)
    barrier = threading.Barrier(2, timeout=30)
    original = capped_rows._capped_partition
    calls = []

    def meeting(path, *args, **kwargs):
        calls.append(path)
        if len(calls) <= 2:
            barrier.wait()
        return original(path, *args, **kwargs)

    monkeypatch.setattr(capped_rows, "_capped_partition", meeting)
    monkeypatch.setattr(capped_rows, "GRAPH_THREADS", 2)
    build_graph(paths, settings)
    assert len(calls) == 6 and load_graph(paths.graph_dir).meta["partitions"] == list(range(6))


def test_a_partition_failing_on_its_thread_stops_the_build(tmp_path, monkeypatch):
    """The third of six partitions is truncated: its error comes out of the build (raised at
    its file), the partitions after it are not all capped, and nothing is left behind."""
    paths, settings, _ = many_partitions(tmp_path)
    parts = sorted((paths.snapshot_dir / "follow_edges").glob("shard_id=*/*.parquet"))
    parts[2].write_bytes(parts[2].read_bytes()[:20])
    original = capped_rows._capped_partition
    capped = []

    def counting(path, *args, **kwargs):
        capped.append(path)
        return original(path, *args, **kwargs)

    monkeypatch.setattr(capped_rows, "_capped_partition", counting)
    monkeypatch.setattr(capped_rows, "GRAPH_THREADS", 2)
    with pytest.raises(CorruptFileError, match=rf"{parts[2]} is unreadable as Parquet"):
        build_graph(paths, settings)
    assert parts[2] in capped and len(capped) < 6
    assert not (paths.graph_dir / "meta.json").exists()
    assert not [p for p in paths.run_dir.iterdir() if p.name.startswith(".")]
    assert not [t for t in threading.enumerate() if t.name.startswith("recs-graph")]


def test_a_follow_filed_under_another_shard_stops_the_graph_build(tmp_path):
    """Partition 2's file with one of partition 3's rows appended (its follower hashes to 3):
    capping it raises, naming the file, the rows, the follower and its shard, so the night
    stops before any shard task (each would read only its own partition)."""
    from recs.sharding import shard_of

    paths, settings, edges = many_partitions(tmp_path)
    part = paths.snapshot_dir / "follow_edges" / "shard_id=002" / "part-0.parquet"
    stray = next(edge for edge in edges if shard_of(edge[0], 6) == 3)
    extra = pl.DataFrame(
        [(stray[0], stray[1], None, stray[2])], schema=SNAPSHOT_SCHEMAS["follow_edges"],
        orient="row",
    )
    pl.concat([pl.read_parquet(part), extra]).write_parquet(part)
    with pytest.raises(CorruptFileError) as caught:
        build_graph(paths, settings)
    assert str(caught.value) == (
        f"{part}: follow edges with a follower of another shard: 1 (e.g. follower {stray[0]}, "
        "of shard 3 of 6): the partition is not as freeze_snapshot wrote it; make the date's "
        "snapshot again from the live store with --rebuild-snapshot (the DAG's rebuild_snapshot "
        "param)"
    )


@pytest.mark.parametrize("hop2_order", ["sample", "popularity", "reciprocity"])
def test_the_graph_capped_by_partition_groups_is_the_one_process_graph(tmp_path, hop2_order):
    """The DAG's way (a plan, the partitions capped in groups by separate calls, in another
    order, each reading its own id map, then the assembly) writes every file of the graph with
    the bytes ``build_graph`` writes in one process."""
    from recs.traversal.graph import assemble_graph
    from recs.traversal.graph_pieces import cap_pieces, plan_pieces

    paths, _, _ = many_partitions(tmp_path)
    settings = settings_for(tmp_path, shard_count=6, hop2_cap=7, hop2_order=hop2_order)
    build_graph(paths, settings)
    whole = graph_files(paths.graph_dir)
    shutil.rmtree(paths.graph_dir)
    shutil.rmtree(paths.run_dir / "graph_pieces")

    plan = plan_pieces(paths, settings)
    assert plan["partitions"] == list(range(6))
    assert plan["reciprocity"] is (hop2_order == "reciprocity")
    for group in ([4, 5], [0, 1, 2], [3]):
        cap_pieces(paths, settings, group)
    assemble_graph(paths, settings)
    assert graph_files(paths.graph_dir) == whole


def test_a_missing_or_stale_piece_is_refused_naming_its_partitions(tmp_path):
    """Run again after it removed the pieces, the assembly keeps the graph it built (without
    that graph, it needs them). It takes a piece only through its piece.json with the plan's
    inputs and arrays of the sizes it records: a piece whose piece.json is gone (a cap killed
    half-way), one with an array cut short, and the pieces of an earlier plan (another
    hop2_cap) are refused, naming the partitions; a plan from another snapshot manifest is
    refused; once capped again, the graph is the one-process graph."""
    from recs.traversal.graph import assemble_graph
    from recs.traversal.graph_pieces import StalePieceError, cap_pieces, plan_pieces

    paths, settings, _ = many_partitions(tmp_path)
    build_graph(paths, settings)
    whole = (paths.graph_dir / "indices.npy").read_bytes()
    built = {p.name: p.stat().st_mtime_ns for p in paths.graph_dir.iterdir()}
    # run again without its pieces (removed by the build): the graph of this plan, kept as is,
    # also with a piece's folder left (killed while removing them, a review found)
    assert assemble_graph(paths, settings)["n_edges"] == load_graph(paths.graph_dir).n_edges
    (paths.run_dir / "graph_pieces" / "shard_id=002").mkdir()
    assert assemble_graph(paths, settings)["n_edges"] == load_graph(paths.graph_dir).n_edges
    assert {p.name: p.stat().st_mtime_ns for p in paths.graph_dir.iterdir()} == built
    indices = paths.graph_dir / "indices.npy"
    indices.write_bytes(indices.read_bytes()[:-4])  # a graph not whole is never kept
    with pytest.raises(StalePieceError, match=r"partitions \[0, 1, 2, 3, 4, 5\]"):
        assemble_graph(paths, settings)  # and the pieces are gone: capping comes first
    (paths.graph_dir / "meta.json").unlink()  # an assembly killed after it began: not built
    cap_pieces(paths, settings, [0, 1, 2, 3, 4, 5])
    (paths.run_dir / "graph_pieces" / "shard_id=003" / "piece.json").unlink()
    cut = paths.run_dir / "graph_pieces" / "shard_id=005" / "000.dst.npy"  # not fsynced: a crash
    cut.write_bytes(cut.read_bytes()[:-4])
    with pytest.raises(StalePieceError, match=r"partitions \[3, 5\]"):
        assemble_graph(paths, settings)

    smaller = settings.model_copy(update={"hop2_cap": 5})
    plan_pieces(paths, smaller)
    assert not (paths.graph_dir / "meta.json").exists()  # a new plan: the graph is not built
    cap_pieces(paths, smaller, [0, 1])
    with pytest.raises(StalePieceError, match=r"partitions \[2, 3, 4, 5\]"):
        assemble_graph(paths, smaller)
    with pytest.raises(StalePieceError, match="not in the run's graph plan"):
        cap_pieces(paths, smaller, [6])

    plan_pieces(paths, settings)
    manifest = read_json(paths.snapshot_manifest)
    write_json(paths.snapshot_manifest, {**manifest, "refrozen": True})
    with pytest.raises(StalePieceError, match="another snapshot or other settings"):
        cap_pieces(paths, settings, [0])
    write_json(paths.snapshot_manifest, manifest)
    cap_pieces(paths, settings, [0, 1, 2, 3, 4, 5])
    assemble_graph(paths, settings)
    assert (paths.graph_dir / "indices.npy").read_bytes() == whole


def listed_in_manifest(paths) -> None:
    """Add the freeze's ``follow_edges_shards`` (path and rows of each partition's file) to
    the fixture's manifest, as ``freeze_snapshot`` writes it."""
    shards = [
        {"shard_id": int(folder.name.split("=")[1]),
         "path": str(part.relative_to(paths.snapshot_dir)), "rows": pl.read_parquet(part).height}
        for folder in sorted((paths.snapshot_dir / "follow_edges").iterdir())
        for part in sorted(folder.glob("*.parquet"))
    ]
    write_json(paths.snapshot_manifest, {**read_json(paths.snapshot_manifest),
                                         "follow_edges_shards": shards})


def test_a_graph_an_earlier_plan_assembled_is_not_kept_for_the_same_plan_made_again(tmp_path):
    """(From a review: with a run store, a second worker kept the first attempt's graph for a
    rerun whose snapshot and settings, so whose plan, were byte for byte the same, and skipped
    the in-degree check.) The same snapshot and settings planned again give another plan
    (``plan_id``): a worker's graph with the earlier plan's ``meta.json`` is assembled again,
    from this plan's pieces, and its check runs."""
    import shutil

    from recs.traversal.graph import assemble_graph
    from recs.traversal.graph_pieces import cap_pieces, plan_pieces
    from recs.traversal.in_degree_check import InDegreeMismatchError

    paths, settings, _ = many_partitions(tmp_path)
    listed_in_manifest(paths)
    first = plan_pieces(paths, settings)
    cap_pieces(paths, settings, list(range(6)))
    assemble_graph(paths, settings)
    other_worker = tmp_path / "graph of the first attempt"
    shutil.copytree(paths.graph_dir, other_worker)
    second = plan_pieces(paths, settings)
    assert second["plan_id"] != first["plan_id"]
    assert {k: v for k, v in second.items() if k != "plan_id"} == {
        k: v for k, v in first.items() if k != "plan_id"
    }
    cap_pieces(paths, settings, list(range(6)))
    shutil.rmtree(paths.graph_dir)
    shutil.copytree(other_worker, paths.graph_dir)  # this worker's copy, as the first made it
    degrees = paths.snapshot_dir / IN_DEGREES_FILE
    frame = pl.read_parquet(degrees)
    degrees.unlink()
    frame.with_columns(pl.col("in_degree") + 1).write_parquet(degrees)
    with pytest.raises(InDegreeMismatchError):
        assemble_graph(paths, settings)


def test_a_partition_is_capped_from_the_manifests_files_and_rows(tmp_path):
    """(From a review.) A partition's files come from the snapshot manifest: one gone from the
    disk is an error naming it, not an empty piece the assembly takes; one holding other rows
    than the manifest's is refused; the profiles export the rows' order needs must be there; a
    partition named twice is refused."""
    from recs.traversal.graph_pieces import cap_pieces, plan_pieces

    paths, settings, _ = many_partitions(tmp_path)
    listed_in_manifest(paths)
    plan_pieces(paths, settings)
    folder = paths.snapshot_dir / "follow_edges" / "shard_id=002"
    folder.rename(tmp_path / "away")
    with pytest.raises(RunNotFoundError, match=r"shard_id=002/part-0.parquet"):
        cap_pieces(paths, settings, [2])
    (tmp_path / "away").rename(folder)
    part = folder / "part-0.parquet"
    frame = pl.read_parquet(part)
    frame.head(frame.height - 1).write_parquet(part)
    with pytest.raises(CorruptFileError, match=rf"partition 2 .* hold {frame.height - 1} follow "
                       rf"edges, its manifest {frame.height}"):
        cap_pieces(paths, settings, [2])
    frame.write_parquet(part)
    profiles = paths.exports_dir / "candidate_profiles.parquet"
    profiles.rename(tmp_path / "profiles.parquet")
    with pytest.raises(RunNotFoundError, match="candidate_profiles.parquet: run build_models"):
        cap_pieces(paths, settings, [2])
    (tmp_path / "profiles.parquet").rename(profiles)
    with pytest.raises(ValueError, match="repeated"):
        cap_pieces(paths, settings, [2, 2])


@pytest.mark.parametrize(
    "damage", ["truncated", "no files", "files emptied", "sizes emptied", "not an object"]
)
def test_a_damaged_piece_json_is_a_stale_piece(tmp_path, damage):
    """(From a review: a KeyError, or a partition's edges silently dropped.) A piece.json cut
    short, without its files, with its files or sizes emptied, or not an object: the assembly
    names the partition among the stale ones."""
    from recs.traversal.graph import assemble_graph
    from recs.traversal.graph_pieces import StalePieceError, cap_pieces, plan_pieces

    paths, settings, _ = many_partitions(tmp_path)
    listed_in_manifest(paths)
    plan_pieces(paths, settings)
    cap_pieces(paths, settings, list(range(6)))
    piece = paths.run_dir / "graph_pieces" / "shard_id=004" / "piece.json"
    document = read_json(piece)
    if damage == "truncated":
        piece.write_text(piece.read_text()[:40])
    elif damage == "no files":
        write_json(piece, {k: v for k, v in document.items() if k != "files"})
    elif damage == "files emptied":
        write_json(piece, {**document, "files": []})
    elif damage == "sizes emptied":
        write_json(piece, {**document, "files": [{**f, "sizes": {}} for f in document["files"]]})
    else:
        piece.write_text("[1, 2]")
    with pytest.raises(StalePieceError, match=r"partitions \[4\]"):
        assemble_graph(paths, settings)
