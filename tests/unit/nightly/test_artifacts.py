"""The run store (``recs.nightly.artifacts``) and the machine's graph copy (``graph_cache``) on
fsspec's in-memory filesystem and on a local folder URL, with hand-made run folders.

Each test makes its run folders by hand: a few files per part, bytes chosen to differ, so a file
in the wrong place or from the wrong attempt shows. Two homes stand for two machines that share
nothing but the store.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from recs import cli
from recs.config import get_settings
from recs.errors import ArtifactNotFoundError, RunStoreError
from recs.nightly import artifacts, withdrawal
from recs.nightly.artifacts import GRAPH, MODELS, SNAPSHOT, VALIDATION, RunStore, shard_part
from recs.nightly.graph_cache import local_graph
from recs.nightly.runs import RunPaths

DATE = "2026-11-01"
RUN_ID = "r1"


@pytest.fixture(params=["memory", "file"])
def store(request, tmp_path) -> RunStore:
    """An empty run store: a fresh root on fsspec's memory filesystem, or a file:// folder."""
    if request.param == "memory":
        root = f"memory://runstore-{uuid.uuid4().hex[:12]}/prefix"
    else:
        root = (tmp_path / "shared volume").as_uri()
    made = RunStore(root)
    yield made
    if request.param == "memory" and made.fs.exists(made.root):
        made.fs.rm(made.root, recursive=True)


def machine(tmp_path: Path, name: str) -> RunPaths:
    return RunPaths.create(tmp_path / name, DATE, RUN_ID)


def write(paths: RunPaths, files: dict[str, bytes]) -> None:
    for relative, body in files.items():
        target = paths.run_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)


def tree(paths: RunPaths, under: str = "") -> dict[str, bytes]:
    root = paths.run_dir / under
    return {
        p.relative_to(paths.run_dir).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(x.startswith(".") for x in p.relative_to(paths.run_dir).parts)
    }


SNAPSHOT_FILES = {
    "snapshot/manifest.json": json.dumps({"settings": {"shard_count": 2}}).encode(),
    "snapshot/users.parquet": b"users" * 100,
    "snapshot/follow_edges/shard_id=000/part-0.parquet": b"edges of shard 0",
    "snapshot/follow_edges/shard_id=001/part-0.parquet": b"edges of shard 1",
}


def test_push_then_pull_on_another_machine_gives_the_same_files_and_mtimes(store, tmp_path):
    """Machine a pushes its snapshot (plus a hidden staging leftover, which is not part of it);
    machine b pulls it whole: the same bytes and modification times, nothing hidden. A second
    pull downloads nothing. A pull of one shard's partition brings only that file."""
    a, b, c = machine(tmp_path, "a"), machine(tmp_path, "b"), machine(tmp_path, "c")
    write(a, {**SNAPSHOT_FILES, "snapshot/.users.parquet.123-abcd.tmp": b"killed attempt"})
    pushed = store.push(a, SNAPSHOT)
    assert pushed["files"] == pushed["uploaded"] == 4

    assert store.pull(b, SNAPSHOT)["downloaded"] == 4
    assert tree(b) == SNAPSHOT_FILES
    for relative in SNAPSHOT_FILES:
        mtimes = [(m.run_dir / relative).stat().st_mtime_ns for m in (a, b)]
        assert mtimes[0] == mtimes[1]
    assert store.pull(b, SNAPSHOT)["downloaded"] == 0

    shard_1 = "snapshot/follow_edges/shard_id=001/*"
    one = store.pull(c, SNAPSHOT, ("snapshot/manifest.json", shard_1))
    assert one["downloaded"] == 2
    assert set(tree(c)) == {
        "snapshot/manifest.json",
        "snapshot/follow_edges/shard_id=001/part-0.parquet",
    }


def test_a_push_that_dies_half_way_is_not_trusted(store, tmp_path, monkeypatch):
    """A complete push of the models, then a rerun whose upload raises after its first file:
    the marker was withdrawn before the upload, so a pull elsewhere refuses the part instead of
    mixing the two attempts' files; the next complete push is trusted again."""
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    hubs, popularity = "exports/hub_accounts.parquet", "exports/popularity_index.parquet"
    write(a, {hubs: b"v1 hubs", popularity: b"v1 popularity"})
    store.push(a, MODELS)
    write(a, {hubs: b"v2 hubs!", popularity: b"v2 popularity!"})

    real_put = store.fs.put

    def dies_after_one_file(lpaths, rpaths, **kwargs):
        real_put(lpaths[:1], rpaths[:1], **kwargs)
        raise KeyboardInterrupt("worker killed mid-upload")

    monkeypatch.setattr(store.fs, "put", dies_after_one_file)
    with pytest.raises(KeyboardInterrupt):
        store.push(a, MODELS)
    monkeypatch.setattr(store.fs, "put", real_put)
    with pytest.raises(ArtifactNotFoundError, match="no complete models"):
        store.pull(b, MODELS)
    assert tree(b) == {}

    store.push(a, MODELS)
    store.pull(b, MODELS)
    assert tree(b) == tree(a)


def test_a_file_rewritten_after_its_marker_fails_the_pull(store, tmp_path):
    """The marker names each file's sha256: a file replaced behind it (a rerun writing while
    another machine reads) is refused, never handed to the stage."""
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    write(a, SNAPSHOT_FILES)
    store.push(a, SNAPSHOT)
    store.fs.pipe_file(store.remote(a, "snapshot/users.parquet"), b"USERS" * 100)
    with pytest.raises(ArtifactNotFoundError, match="not the file its marker names"):
        store.pull(b, SNAPSHOT)
    assert not (b.run_dir / "snapshot" / "users.parquet").exists()


def test_a_rerun_of_the_writer_repairs_a_damaged_stored_copy(store, tmp_path):
    """(From a review.) A stored file cut short: the pull on b refuses it, and the writer's rerun
    on a, whose local files are unchanged, uploads that file again (its stored size differs),
    so b's pull then succeeds. A stored file damaged with its size kept: the pull's message
    names the marker to remove; once it is removed, the writer's rerun uploads every file."""
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    write(a, SNAPSHOT_FILES)
    store.push(a, SNAPSHOT)
    users = store.remote(a, "snapshot/users.parquet")
    store.fs.pipe_file(users, (b"users" * 100)[:250])
    with pytest.raises(ArtifactNotFoundError, match="not the file its marker names"):
        store.pull(b, SNAPSHOT)
    assert store.push(a, SNAPSHOT)["uploaded"] == 1
    store.pull(b, SNAPSHOT)
    assert tree(b) == tree(a)

    store.fs.pipe_file(users, b"USERS" * 100)
    c = machine(tmp_path, "c")
    marker = f"{store.run_root(a)}/.parts/{SNAPSHOT.name}.json"
    with pytest.raises(ArtifactNotFoundError) as raised:
        store.pull(c, SNAPSHOT)
    assert f"remove the marker {marker}, then rerun the stage that writes snapshot" in str(
        raised.value
    )
    assert store.push(a, SNAPSHOT)["uploaded"] == 0  # the size is the same: kept
    store.fs.rm(marker)
    assert store.push(a, SNAPSHOT)["uploaded"] == 4
    store.pull(c, SNAPSHOT)
    assert tree(c) == tree(a)


def test_pull_removes_what_the_store_does_not_hold(store, tmp_path):
    """Machine b has a shard folder from an earlier attempt; the store's shard 1 has no marker
    (failed tonight): an optional pull removes b's copy, so the gate sees the shard failed. A
    stale file of a pulled part is removed too, and a push removes the store's stale files."""
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    write(b, {"shards/shard_id=001/manifest.json": b"{}", "shards/shard_id=001/x.parquet": b"x"})
    assert store.pull(b, shard_part(1), required=False)["present"] is False
    assert tree(b) == {}

    write(a, {"graph/meta.json": b"{}", "graph/indices.npy": b"1234", "graph/old.npy": b"old"})
    store.push(a, GRAPH)
    (a.run_dir / "graph" / "old.npy").unlink()
    store.push(a, GRAPH)
    assert not store.fs.exists(store.remote(a, "graph/old.npy"))
    write(b, {"graph/old.npy": b"old"})
    store.pull(b, GRAPH)
    assert tree(b) == {"graph/indices.npy": b"1234", "graph/meta.json": b"{}"}


def test_withdraw_shards_keeps_only_this_plan(store, tmp_path, monkeypatch):
    """A rerun planned with 2 shards instead of 4: the store's shards 2 and 3 are removed and
    the markers of shards 0 and 1 withdrawn (their files stay until the traversal replaces
    them); a pull then finds no shard computed."""
    a = machine(tmp_path, "a")
    for shard_id in range(4):
        write(a, {f"shards/shard_id={shard_id:03d}/manifest.json": b"{}"})
        store.push(a, shard_part(shard_id))
    monkeypatch.setattr(artifacts, "run_store", lambda: store)
    withdrawal.withdraw_shards(a, 2)
    assert all(store.marker(a, shard_part(i)) is None for i in range(4))
    assert store.fs.exists(store.remote(a, "shards/shard_id=001/manifest.json"))
    assert not store.fs.exists(store.remote(a, "shards/shard_id=002/manifest.json"))
    assert store.fs.find(store.remote(a, "shards/shard_id=003")) == []


def test_withdraw_shards_asks_the_store_twice_not_once_per_planned_shard(
    store, tmp_path, monkeypatch
):
    """(From a review: about 2,000 requests a night at 1,024 shards.) Withdrawing a plan of 64
    shards from a store that holds none makes two requests (the two listings); holding the
    markers of shards 3 and 40 adds one removal of both, and their files stay."""
    a = machine(tmp_path, "a")
    monkeypatch.setattr(artifacts, "run_store", lambda: store)
    calls: list[str] = []
    inside: list[str] = []  # a backend's rm may call its own exists: one request is counted

    def counted(name, real):
        def call(*args, **kwargs):
            if not inside:
                calls.append(name)
            inside.append(name)
            try:
                return real(*args, **kwargs)
            finally:
                inside.pop()

        return call

    for name in ("exists", "find", "ls", "rm", "cat_file", "cat"):  # what the store code calls
        monkeypatch.setattr(store.fs, name, counted(name, getattr(store.fs, name)))
    withdrawal.withdraw_shards(a, 64)
    assert calls == ["ls", "ls"]
    for shard_id in (3, 40):
        write(a, {f"shards/shard_id={shard_id:03d}/manifest.json": b"{}"})
        store.push(a, shard_part(shard_id))
    calls.clear()
    withdrawal.withdraw_shards(a, 64)
    assert calls == ["ls", "ls", "rm"]
    assert store.marker(a, shard_part(3)) is None and store.marker(a, shard_part(40)) is None
    assert store.fs.exists(store.remote(a, "shards/shard_id=040/manifest.json"))


@pytest.mark.parametrize("root", ["shard_id=0", "shard_id=9"])
def test_withdraw_shards_reads_names_in_the_run_not_the_store_path(root, tmp_path, monkeypatch):
    """(From a review: a first version matched ``shard_id=N`` anywhere in a store path.) A store
    whose own path has a folder named like a shard: a plan of 4 withdraws the markers of shards
    0-3 (their files stay), removes shards 4 and 5 whole, and keeps every other marker (the
    snapshot's, the graph's, a gate result's and a graph piece's)."""
    from recs.nightly.parts import gate_part, graph_piece_part

    store = RunStore(f"memory://{root}/store-{uuid.uuid4().hex[:8]}")
    a = machine(tmp_path, "a")
    others = [SNAPSHOT, GRAPH, gate_part(1), graph_piece_part(2)]
    for part in [*others, *(shard_part(i) for i in range(6))]:
        write(a, {f"{part.roots[0]}/manifest.json": b"{}"})
        store.push(a, part)
    monkeypatch.setattr(artifacts, "run_store", lambda: store)
    withdrawal.withdraw_shards(a, 4)
    assert [store.marker(a, shard_part(i)) for i in range(6)] == [None] * 6
    assert all(store.marker(a, part) is not None for part in others)
    assert store.fs.exists(store.remote(a, "shards/shard_id=003/manifest.json"))
    assert store.names(a, "shards") == [f"shard_id={i:03d}" for i in range(4)]
    store.fs.rm(f"/{root}", recursive=True)


def test_a_rerun_frozen_again_withdraws_the_earlier_attempt_from_the_store(
    store, tmp_path, monkeypatch
):
    """``withdrawal.withdraw_results``, as a rerun's freeze calls it: the earlier attempt's
    shards, graph and verdict are withdrawn from the store (the snapshot stays), so machine b
    finds no complete graph or validation to traverse or publish with (the files stay until
    this attempt pushes its own); locally the same files are gone."""
    a, b = machine(tmp_path, "a"), machine(tmp_path, "b")
    done = {
        "snapshot/manifest.json": b"{}",
        "graph/meta.json": b"{}",
        "validation/summary.json": b'{"outcome": "passed"}',
        "validation/results.json": b"{}",
        **{f"shards/shard_id={i:03d}/manifest.json": b"{}" for i in range(2)},
    }
    write(a, done)
    for part in (SNAPSHOT, GRAPH, VALIDATION, shard_part(0), shard_part(1)):
        store.push(a, part)
    monkeypatch.setattr(artifacts, "run_store", lambda: store)
    withdrawal.withdraw_results(a, 2)
    assert store.marker(a, SNAPSHOT) is not None
    for part in (GRAPH, VALIDATION, shard_part(0), shard_part(1)):
        assert store.marker(a, part) is None, part.name
    assert store.fs.exists(store.remote(a, "validation/summary.json"))
    for part, name in ((GRAPH, "graph"), (VALIDATION, "validation")):
        with pytest.raises(ArtifactNotFoundError, match=f"has no complete {name}"):
            store.pull(b, part)
    assert sorted(tree(a)) == ["snapshot/manifest.json"]


def test_a_freeze_that_fails_keeps_the_stores_snapshot(store, tmp_path, monkeypatch):
    """(From a review.) A rerun's freeze refused (a plan too large for Airflow, the store
    away): the snapshot marker the earlier attempt pushed stays, so it can still be published;
    a freeze that succeeds replaces it (``push`` withdraws it first)."""
    from recs.errors import ShardPlanError

    a = machine(tmp_path, "a")
    write(a, {"snapshot/manifest.json": b'{"settings": {"shard_count": 1}}'})
    store.push(a, SNAPSHOT)
    monkeypatch.setattr(artifacts, "run_store", lambda: store)
    with pytest.raises(ShardPlanError):
        with artifacts.synced(a, "freeze_snapshot"):
            raise ShardPlanError("injected: 2,000 shards, more than max_map_length 1,024")
    assert store.marker(a, SNAPSHOT) is not None


def graph_files(version: bytes) -> dict[str, bytes]:
    return {"graph/meta.json": b'{"v": 1}', "graph/indices.npy": version * 1000}


def test_the_graph_is_copied_once_per_machine_and_again_when_it_changes(
    store, tmp_path, monkeypatch
):
    """Four shard tasks of one machine ask for the graph at once (threads, each with its own
    lock descriptor, as processes would be): one downloads it, the others wait and reuse that
    copy; a task on another machine downloads its own. After build_graph is rerun with other
    bytes, the checksum in the marker changes and the next task downloads the new graph; the old
    copy is removed."""
    builder = machine(tmp_path, "builder")
    write(builder, graph_files(b"A"))
    store.push(builder, GRAPH)
    gets = []
    real_get = store.fs.get

    def slow_get(*args, **kwargs):  # long enough for the other three to arrive meanwhile
        gets.append(args)
        time.sleep(0.5)
        return real_get(*args, **kwargs)

    monkeypatch.setattr(store.fs, "get", slow_get)

    cache = tmp_path / "worker-1" / "cache"
    results, errors = [], []
    start = threading.Barrier(4)

    def task():
        try:
            start.wait()
            with local_graph(store, machine(tmp_path, "worker-1"), cache) as got:
                results.append(got)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=task) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert sorted(r.downloaded for r in results) == [False, False, False, True]
    assert len({r.graph_dir for r in results}) == 1 and len(gets) == 1
    first = results[0]
    assert (first.graph_dir / "indices.npy").read_bytes() == b"A" * 1000

    other = use(store, machine(tmp_path, "worker-2"), tmp_path / "worker-2" / "cache")
    assert other.downloaded and other.checksum == first.checksum and len(gets) == 2

    write(builder, graph_files(b"B"))
    store.push(builder, GRAPH)
    again = use(store, machine(tmp_path, "worker-1"), cache)
    assert again.downloaded and again.checksum != first.checksum
    assert (again.graph_dir / "indices.npy").read_bytes() == b"B" * 1000
    assert not first.graph_dir.exists()
    with local_graph(store, machine(tmp_path, "worker-1"), cache) as last:
        assert last.downloaded is False


def test_a_damaged_copy_on_the_machine_is_downloaded_again(store, tmp_path, monkeypatch):
    """(From a review.) The machine's copy of the graph rewritten in place (same size, new
    mtime), then a file of it removed: each time the next task finds the copy is not as its
    download left it, downloads it again and maps the store's bytes; a task holding the copy
    meanwhile finds every file there all along (they are replaced one by one). A rebuild with
    the same bytes (same checksum, other mtimes in the marker) is not downloaded again."""
    builder, worker = machine(tmp_path, "builder"), machine(tmp_path, "worker")
    write(builder, graph_files(b"A"))
    store.push(builder, GRAPH)
    cache = tmp_path / "worker" / "cache"
    seen = []
    real_fetch = store.fetch

    def watched(*args, **kwargs):  # what a task holding the copy sees while it is mended
        seen.append(sorted(p.name for p in first.graph_dir.iterdir()))
        return real_fetch(*args, **kwargs)

    with local_graph(store, worker, cache) as first:  # a task holds the copy throughout
        assert first.downloaded
        indices = first.graph_dir / "indices.npy"
        indices.write_bytes(b"Z" * 1000)
        monkeypatch.setattr(store, "fetch", watched)
        again = use(store, worker, cache)
    assert seen == [["indices.npy", "meta.json"]]
    assert again.downloaded and again.graph_dir == first.graph_dir
    assert indices.read_bytes() == b"A" * 1000
    (first.graph_dir / "meta.json").unlink()
    third = use(store, worker, cache)
    assert third.downloaded and (third.graph_dir / "meta.json").read_bytes() == b'{"v": 1}'
    assert use(store, worker, cache).downloaded is False

    time.sleep(0.01)
    write(builder, graph_files(b"A"))  # rebuilt: the same bytes, new mtimes
    assert store.push(builder, GRAPH)["checksum"] == first.checksum
    assert use(store, worker, cache).downloaded is False
    run_cache = cache / DATE / RUN_ID
    assert sorted(p.name for p in run_cache.iterdir() if p.is_dir()) == [first.checksum[:32]]


def test_no_graph_in_the_store_is_one_clear_error(store, tmp_path):
    with pytest.raises(ArtifactNotFoundError, match="build_graph has not succeeded"):
        with local_graph(store, machine(tmp_path, "w"), tmp_path / "cache"):
            pass


def test_a_malformed_run_store_url_is_one_line(tmp_path, monkeypatch, capsys):
    """``recs run`` with a run store of an unknown protocol, or one whose package is missing:
    exit 2 and one line naming the setting, before anything is read from the live store."""
    with pytest.raises(RunStoreError, match="RECS_RUN_STORE_URL"):
        RunStore("nosuchprotocol://bucket/x")
    # (from a review) a '/' before the bucket: its listings never matched its paths
    with pytest.raises(RunStoreError, match=r"the bucket must follow 's3://' directly"):
        RunStore("s3:///recs-runs/nightly")
    monkeypatch.setenv("RECS_HOME", str(tmp_path / "home"))
    for url in ("nosuchprotocol://bucket/x", "gs://bucket/runs"):
        monkeypatch.setenv("RECS_RUN_STORE_URL", url)
        get_settings.cache_clear()
        artifacts._open.cache_clear()
        try:
            code = cli.main(["run", "--snapshot-date", DATE])
        finally:
            get_settings.cache_clear()
            artifacts._open.cache_clear()
        lines = capsys.readouterr().err.splitlines()
        errors = [line for line in lines if line.startswith("recs: error: ")]
        assert code == 2 and len(errors) == 1, lines
        assert "unusable run store" in errors[0] and "Traceback" not in "\n".join(lines)
    monkeypatch.setenv("RECS_RUN_STORE_URL", "memory://runs")
    monkeypatch.setenv("RECS_RUN_STORE_OPTIONS", '{"endpoint_url": ')
    get_settings.cache_clear()
    code = cli.main(["run", "--snapshot-date", DATE])
    get_settings.cache_clear()
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("recs: error: invalid setting RECS_RUN_STORE_OPTIONS: "), err
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "home" / "live.db").exists()


def test_a_store_folder_must_be_absolute_and_where_it_is_made_must_exist(tmp_path):
    """(From a review.) A mistyped or unmounted folder was made silently on this machine's disk
    and a relative one resolved against each task's working directory: both are one-line
    errors now, as is one under a file. A store folder not made yet, in a folder that exists, is
    fine (its first push makes it), and checking it makes nothing."""
    with pytest.raises(RunStoreError, match="must be an absolute path"):
        RunStore("relative/runs")
    missing = tmp_path / "no-such-mount" / "runs"
    for url in (str(missing), missing.as_uri()):
        with pytest.raises(RunStoreError, match="no-such-mount does not exist: create the folder"):
            RunStore(url).check()
    assert not (tmp_path / "no-such-mount").exists()
    RunStore(str(tmp_path / "runs")).check()
    RunStore((tmp_path / "runs").as_uri()).check()
    assert not (tmp_path / "runs").exists()
    (tmp_path / "a file").write_text("")  # a review's store under a file read as empty
    with pytest.raises(RunStoreError, match="a file is a file, not a folder: correct RECS_RUN"):
        RunStore((tmp_path / "a file" / "runs").as_uri()).check()


def test_no_run_store_means_no_copies(tmp_path, monkeypatch):
    """The default: ``synced`` yields no graph folder and touches nothing."""
    monkeypatch.delenv("RECS_RUN_STORE_URL", raising=False)
    get_settings.cache_clear()
    try:
        paths = machine(tmp_path, "a")
        with artifacts.synced(paths, "traverse_shard", 0) as sync:
            assert sync.graph_dir is None
        assert not paths.run_dir.exists() and not os.listdir(tmp_path)
    finally:
        get_settings.cache_clear()


def test_find_run_brings_the_manifest_of_a_run_this_machine_has_not_seen(
    store, tmp_path, monkeypatch
):
    """``recs shard run --run-id R`` on a fresh machine: the run's snapshot manifest comes from
    the store (nothing else), so the command finds the run; a run the store does not hold is
    the usual one-line ``RunNotFoundError``."""
    from recs.errors import RunNotFoundError

    a = machine(tmp_path, "a")
    write(a, SNAPSHOT_FILES)
    store.push(a, SNAPSHOT)
    monkeypatch.setattr(artifacts, "run_store", lambda: store)
    found = artifacts.find_run(tmp_path / "b", DATE, RUN_ID)
    assert found.home == tmp_path / "b" and set(tree(found)) == {"snapshot/manifest.json"}
    with pytest.raises(RunNotFoundError, match="no run other"):
        artifacts.find_run(tmp_path / "b", DATE, "other")


def use(store, paths, cache):
    """Take the machine's copy of a run's graph and let it go at once (a finished task)."""
    with local_graph(store, paths, cache) as got:
        return got


def test_a_machine_keeps_one_runs_graph_and_spares_a_run_being_downloaded(store, tmp_path):
    """One machine, four runs in turn: r1's copy goes when r2's arrives; when r3's arrives, r2's
    stays, because another task holds r2's lock (it is downloading it); it goes with r4's."""
    import fcntl

    cache = tmp_path / "worker" / "cache"
    runs = {}
    for run_id in ("r1", "r2", "r3", "r4"):
        builder = RunPaths.create(tmp_path / "builder", DATE, run_id)
        write(builder, graph_files(run_id.encode()))
        store.push(builder, GRAPH)
        runs[run_id] = RunPaths.create(tmp_path / "worker", DATE, run_id)
    use(store, runs["r1"], cache)
    use(store, runs["r2"], cache)
    assert not (cache / DATE / "r1").exists()

    held = os.open(cache / DATE / "r2" / ".lock", os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        use(store, runs["r3"], cache)
        assert sorted(p.name for p in (cache / DATE).iterdir()) == ["r2", "r3"]
    finally:
        os.close(held)
    kept = use(store, runs["r4"], cache)
    assert sorted(p.name for p in (cache / DATE).iterdir()) == ["r4"]
    assert (kept.graph_dir / "indices.npy").read_bytes() == b"r4" * 1000


def test_a_copy_in_use_is_removed_only_after_its_task_ends(store, tmp_path):
    """A shard task of r1 holds its copy (handed over, maybe not mapped yet). On the same
    machine build_graph of r1 is rerun with other bytes and a task downloads them, then a task
    of r2 downloads r2's graph: each removes the copies no task holds, and r1's first copy,
    still in use, stays whole. Once its task ends, the next download removes it."""
    cache = tmp_path / "worker" / "cache"
    runs = ("r1", "r2")
    builder = {run_id: RunPaths.create(tmp_path / "builder", DATE, run_id) for run_id in runs}
    worker = {run_id: RunPaths.create(tmp_path / "worker", DATE, run_id) for run_id in runs}
    write(builder["r1"], graph_files(b"1"))
    store.push(builder["r1"], GRAPH)
    with local_graph(store, worker["r1"], cache) as first:
        write(builder["r1"], graph_files(b"one"))
        store.push(builder["r1"], GRAPH)
        rebuilt = use(store, worker["r1"], cache)
        assert rebuilt.downloaded and rebuilt.checksum != first.checksum
        write(builder["r2"], graph_files(b"2"))
        store.push(builder["r2"], GRAPH)
        use(store, worker["r2"], cache)
        assert (first.graph_dir / "indices.npy").read_bytes() == b"1" * 1000
        assert not rebuilt.graph_dir.exists()  # nobody used it: removed by r2's download
        assert sorted(p.name for p in (cache / DATE).iterdir()) == ["r1", "r2"]
    write(builder["r2"], graph_files(b"two"))
    store.push(builder["r2"], GRAPH)
    use(store, worker["r2"], cache)
    assert sorted(p.name for p in (cache / DATE).iterdir()) == ["r2"]
    assert [p.name for p in (cache / DATE / "r2").iterdir() if p.is_dir()] == [
        use(store, worker["r2"], cache).checksum[:32]
    ]


def test_an_attempt_the_shard_lock_refuses_leaves_the_store_as_it_was(store, tmp_path, monkeypatch):
    """Shard 0 is computed and in the store; a second attempt at it while the first holds its
    lock is refused (exit 75) and must not withdraw the shard's marker, else the gate would find
    the shard failed and the publish would carry yesterday's rows over."""
    import subprocess
    import sys

    from recs.errors import RunInProgressError
    from recs.nightly import pipeline

    a = machine(tmp_path, "a")
    write(a, {**SNAPSHOT_FILES, "shards/shard_id=000/manifest.json": b"{}"})
    store.push(a, SNAPSHOT)
    store.push(a, shard_part(0))
    monkeypatch.setattr(artifacts, "run_store", lambda: store)
    holder = subprocess.Popen(  # the first attempt, in a process of its own, holding the lock
        [sys.executable, "-c", "import sys, time; from recs.nightly.locks import shard_lock; "
         "from recs.nightly.runs import RunPaths; "
         f"p = RunPaths.create({str(a.home)!r}, {DATE!r}, {RUN_ID!r})\n"
         "with shard_lock(p, 0):\n print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunInProgressError):
            pipeline.traverse_shard(a, 0)
        with pytest.raises(RunInProgressError):
            pipeline.validate_shards(a, [0])
    finally:
        holder.kill()
        holder.wait()
    assert store.marker(a, shard_part(0)) is not None
    assert (a.run_dir / "shards/shard_id=000/manifest.json").exists()


def test_a_rerun_with_the_same_bytes_uploads_nothing_again(store, tmp_path, monkeypatch):
    """freeze_snapshot's sync, twice over the same files: the first uploads the 4 files, the
    retry none (the marker it withdraws as it starts still says what the store holds)."""
    a = machine(tmp_path, "a")
    write(a, SNAPSHOT_FILES)
    monkeypatch.setattr(artifacts, "run_store", lambda: store)
    uploads = []
    real_put = store.fs.put
    monkeypatch.setattr(store.fs, "put", lambda local, remote, **kw: (
        uploads.append(len(local)), real_put(local, remote, **kw))[1])  # fmt: skip
    for _ in range(2):
        with artifacts.synced(a, "freeze_snapshot"):
            pass
    assert uploads == [4]
    assert store.marker(a, SNAPSHOT) is not None


def test_a_file_url_is_the_folder_it_names(tmp_path):
    """``file://`` URLs are percent-encoded (RFC 8089): ``Path.as_uri()`` of a folder with a
    space gives ``.../shared%20volume``, and the store's files land in ``shared volume``, not in a
    folder named with the escape. ``file://localhost/...`` is the same folder; a URL naming
    another host, or no path, is refused in one line (fsspec would take the host for a
    folder relative to the working directory, a different one on each worker)."""
    folder = tmp_path / "shared volume"
    paths = machine(tmp_path, "a")
    write(paths, SNAPSHOT_FILES)
    RunStore(folder.as_uri()).push(paths, SNAPSHOT)
    assert (folder / "runs" / DATE / RUN_ID / "snapshot" / "users.parquet").read_bytes() == (
        b"users" * 100
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "shared volume"]
    assert RunStore(f"file://localhost{folder.as_uri()[7:]}").root == str(folder)
    for url in ("file://fileserver/exports/runs", "file://localhost"):
        with pytest.raises(RunStoreError, match="a file URL names a folder of this machine"):
            RunStore(url)


def test_an_assembly_missing_pieces_names_them_all_before_downloading(store, tmp_path, monkeypatch):
    """build_graph's assembly with a run store, three partitions of which two were never
    pushed (their cap_graph tasks failed): one ``ArtifactNotFoundError`` names both pieces, and
    nothing was downloaded (the snapshot manifest aside), where the pulls named the first
    missing piece only, after downloading the others."""
    from recs.nightly.parts import GRAPH_PLAN, graph_piece_part

    capper, assembler = machine(tmp_path, "capper"), machine(tmp_path, "assembler")
    manifest = json.dumps({"settings": {"shard_count": 3}}).encode()
    write(capper, {
        "snapshot/manifest.json": manifest, "snapshot/users.parquet": b"users",
        "exports/candidate_profiles.parquet": b"profiles", "exports/hub_accounts.parquet": b"hubs",
        "graph_pieces/plan.json": b"{}", "graph_pieces/shard_id=000/piece.json": b"{}",
    })  # fmt: skip
    for part in (SNAPSHOT, MODELS, GRAPH_PLAN, graph_piece_part(0)):
        store.push(capper, part)
    monkeypatch.setattr(artifacts, "run_store", lambda: store)
    with pytest.raises(ArtifactNotFoundError) as raised:
        with artifacts.synced(assembler, "assemble_graph"):
            pass
    message = str(raised.value)
    assert "graph_shard_id=001, graph_shard_id=002 in the run store" in message, message
    assert "graph_shard_id=000" not in message
    assert tree(assembler) == {"snapshot/manifest.json": manifest}


def test_a_machine_that_has_not_seen_a_run_reads_its_summary_from_the_store(
    tmp_path, monkeypatch, capsys
):
    """(From a newcomer: `recs summary --run-id X` on a second machine said "no run", though
    `recs shard run` there could rerun it.) Machine a froze the run and computed shard 0 of 2
    into a shared store; on machine b the summary, with the date or without, pulls the run's
    snapshot manifest and says what the store holds: shard 0, and b's own copies differ. On a,
    with the store away, the summary of a's own copy still prints, the store named as away."""
    a = machine(tmp_path, "a")
    write(a, {
        "snapshot/manifest.json": json.dumps({"shard_count": 2, "row_counts": {}}).encode(),
        "shards/shard_id=000/manifest.json": json.dumps({"shard_id": 0, "rows": 3}).encode(),
    })  # fmt: skip
    store = RunStore((tmp_path / "shared").as_uri())
    store.push(a, SNAPSHOT)
    store.push(a, shard_part(0))
    monkeypatch.setenv("RECS_HOME", str(tmp_path / "b"))
    monkeypatch.setenv("RECS_RUN_STORE_URL", store.url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()
    try:
        for args in (["--run-id", RUN_ID], ["--snapshot-date", DATE, "--run-id", RUN_ID]):
            code = cli.main(["summary", *args, "--json"])
            out, err = capsys.readouterr()
            assert code == 0, err
            totals = json.loads(out)["totals"]
            assert totals["shards_done"] == 0 and totals["run_store"]["shards_done"] == 1
        code = cli.main(["summary", "--run-id", "not-there"])
        assert code == 2 and "no run not-there under" in capsys.readouterr().err
        # a store away does not hide a run this machine holds: its line says the store is away
        monkeypatch.setenv("RECS_HOME", str(tmp_path / "a"))
        monkeypatch.setenv("RECS_RUN_STORE_URL", (tmp_path / "no-such-mount" / "s").as_uri())
        get_settings.cache_clear()
        artifacts._open.cache_clear()
        code = cli.main(["summary", "--snapshot-date", DATE, "--run-id", RUN_ID, "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "no-such-mount does not exist" in json.loads(out)["totals"]["run_store"]["error"]
    finally:
        get_settings.cache_clear()
        artifacts._open.cache_clear()
