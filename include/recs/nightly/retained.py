"""Retained snapshots: the live store as of one date's cut-off, kept under ``snapshots/<date>/``.

``freeze`` reads every table in one read transaction (``recs.store.readers.open_reader``), from
the primary or a hot standby (``recs.store.standby.snapshot_source``), keeps the rows that
existed by the cut-off (``point_in_time``: ``last_active_at`` clamped to it, rows that name an
account created later dropped with it), partitions follow edges by the shard plan chunk by
chunk as they are read, sorts and writes each shard in a thread pool (counting the in-degrees,
``in_degrees``), and renames the folder into place under a per-date lock: a second run of the
same date waits, then reuses it.
A retained snapshot's ``manifest.json`` holds no timings, so the same store gives the same
bytes. ``recs gc`` removes snapshots older than ``snapshot_retention_days`` (``snapshot_removal``).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from recs.config import Settings
from recs.contracts import IN_DEGREE_SCHEMA, SNAPSHOT_SCHEMAS, arrow_schema, check_schema
from recs.errors import CorruptFileError, LiveStoreError, RecsError, SnapshotNotRetainedError
from recs.files import read_json, sha256_file, staging_name, write_json
from recs.nightly import follow_pairs, in_degrees, point_in_time
from recs.nightly.artifacts import Part, run_store
from recs.nightly.runs import RunPaths
from recs.nightly.shard_plan import plan_for
from recs.nightly.snapshot_removal import lock_file, still_at
from recs.sharding import shard_expr
from recs.store.connections import display_url, one_line
from recs.store.readers import LiveStoreReader, open_reader
from recs.store.standby import snapshot_source

log = logging.getLogger("recs.nightly.retained")

MANIFEST = "manifest.json"
SORT_KEYS: dict[str, list[str]] = {
    "users": ["user_id"],
    "follow_edges": follow_pairs.KEYS,
    "blocks": ["blocker_id", "blocked_id"],
    "mutes": ["muter_id", "muted_id"],
    "dismissed_candidates": ["user_id", "candidate_id"],
    "user_interests": ["user_id", "tag"],
}
"""The key of each snapshot table: its primary key in the store, and its sort order on disk."""

PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 1,
    "row_group_size": 1 << 20,
    "write_statistics": True,
    "version": "2.6",
    "data_page_version": "1.0",
}
"""Fixed ``pyarrow.parquet.write_table`` options: the same rows always give the same bytes.
With ``write_parquet``'s dictionary encoding of the string columns only, a follow-edge partition
is written in half the time of zstd level 3 with every column dictionary-encoded, and is as
small (``bench/README.md``, "The night at scale")."""

WRITE_THREADS = min(8, os.cpu_count() or 1)


def folder(home: Path, day: dt.date) -> Path:
    """``<home>/snapshots/<YYYY-MM-DD>/``: the retained snapshot of one date (may not exist)."""
    return Path(home) / "snapshots" / day.isoformat()


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a whole retained snapshot (its manifest is written last)."""
    return (path / MANIFEST).is_file()


def manifest(path: Path) -> dict[str, Any]:
    """A retained snapshot's manifest (``RunNotFoundError`` if there is none,
    ``CorruptFileError`` naming the remedy if it is damaged)."""
    try:
        return read_json(path / MANIFEST)
    except CorruptFileError as damaged:
        raise CorruptFileError(
            f"retained snapshot {path}: {damaged}; make it again from the live store with "
            "--rebuild-snapshot (the DAG's rebuild_snapshot param)"
        ) from None


def retained_dates(home: Path) -> list[str]:
    """The dates (``YYYY-MM-DD``, sorted) with a complete retained snapshot under ``home``."""
    root = Path(home) / "snapshots"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and is_complete(p))


def discard_all(home: Path) -> list[str]:
    """Remove every retained snapshot under ``<home>/snapshots/``, each under its date's lock
    (waits for a freeze of that date); returns the dates removed, sorted.

    For the commands that replace the live store (``load-dataset``, ``generate-graph``, ``import
    --replace``): a snapshot of the store they replaced would otherwise be reused for its date,
    and a run would publish the old graph."""
    removed = []
    for name in retained_dates(home):
        target = Path(home) / "snapshots" / name
        with _date_lock(target):
            if not target.is_dir():
                continue  # removed while we waited (recs gc)
            aside = target.with_name(staging_name(target.name, ".discarded"))
            os.rename(target, aside)
            shutil.rmtree(aside, ignore_errors=True)
        removed.append(name)
    if removed:
        log.info("discarded the retained snapshots of a replaced live store: %s", removed)
    return removed


def eligible_users(path: Path, as_of: dt.datetime, window_days: int) -> int:
    """Users of a retained snapshot that ``eligible_users`` (dbt) selects
    (``point_in_time.is_eligible``)."""
    return (
        pl.scan_parquet(path / "users.parquet")
        .filter(point_in_time.is_eligible(as_of, window_days))
        .select(pl.len())
        .collect()
        .item()
    )


def freeze(
    paths: RunPaths, settings: Settings, *, rebuild: bool, max_map_length: int | None
) -> dict[str, Any] | None:
    """Read the live store as of ``paths``' cut-off into ``folder(...)`` (module docstring).

    Without ``rebuild``, refuses (``SnapshotNotRetainedError``, nothing written) when the store
    has moved more than ``snapshot_max_lag_hours`` past the cut-off; with it, replaces that
    date's retained snapshot. Returns what ``wait_for_standby`` said when it read a hot standby
    (else None). Raises ``LiveStoreError`` for a missing store or a failed read (the caller,
    ``snapshot.freeze_snapshot``, refuses a cut-off still ahead first)."""
    target = folder(paths.home, paths.snapshot_date)
    with _date_lock(target):
        if is_complete(target) and not rebuild:
            return None  # another run of this date froze it while we waited
        cut_off = paths.as_of.replace(tzinfo=None)
        url, standby = snapshot_source(settings)
        if standby is not None:
            log.info("snapshot standby caught up with the primary: %s", standby)
        target.parent.mkdir(parents=True, exist_ok=True)
        for leftover in target.parent.glob(f".{target.name}.*.partial"):
            shutil.rmtree(leftover, ignore_errors=True)  # a killed attempt's (we hold the lock)
        staging = target.with_name(staging_name(target.name, ".partial"))
        # the follow edges' pieces, until written; every other table is written as soon as it
        # is read, so the process holds one table at a time, never all of them (bench/README.md)
        with spill_folder(target) as spill:
            staging.mkdir()
            try:
                tables = {}

                def write_table(name: str, frame: pl.DataFrame) -> None:
                    relative = f"{name}.parquet"
                    write_parquet(
                        frame.sort(SORT_KEYS[name]), SNAPSHOT_SCHEMAS[name], staging / relative
                    )
                    tables[name] = {"path": relative, "rows": frame.height}

                with open_reader(url, settings.snapshot_read_connections) as reader:
                    backend = reader.backend
                    try:
                        users = reader.read_table("users")  # first: the plan, the staleness check
                        newest = point_in_time.newest(users)
                        if not rebuild and newest is not None:
                            refuse_stale(paths, newest, settings.snapshot_max_lag_hours)
                        kept, dropped, excluded = point_in_time.users_as_of(users, cut_off)
                        del users
                        plan = plan_for(
                            kept.filter(
                                point_in_time.is_eligible(cut_off, settings.eligibility_window_days)
                            ).height,
                            settings,
                            max_map_length,
                        )
                        write_table("users", kept)
                        counted = in_degrees.InDegrees.for_accounts(kept.get_column("user_id"))
                        parts, by_status, unknown = read_follow_edges(
                            reader, kept.get_column("user_id"), plan.shard_count, spill,
                            lambda chunk, left_out: point_in_time.as_of(
                                chunk, "follow_edges", cut_off, dropped, left_out
                            ),
                            excluded,
                        )  # fmt: skip
                        del kept
                        for name in ("blocks", "mutes", "dismissed_candidates", "user_interests"):
                            write_table(
                                name,
                                point_in_time.as_of(
                                    reader.read_table(name), name, cut_off, dropped, excluded
                                ),
                            )
                    except (RecsError, OSError, MemoryError):
                        raise  # ours, and writing the tables (a full disk is not the store's)
                    except Exception as error:  # noqa: BLE001 - a driver error mid-read: one line
                        raise LiveStoreError(
                            f"reading the live store {display_url(url)} failed (the run can be "
                            f"retried): {one_line(error, url, limit=300)}"
                        ) from error
                shards = write_follow_edges(
                    parts, plan.shard_count, staging, follow_pairs.LIVE_STORE, counted
                )
                degrees = write_in_degrees(counted.frame(), staging)
                tables["follow_edges"] = {
                    "path": "follow_edges",
                    "rows": sum(s["rows"] for s in shards),
                }
                document = {
                    "snapshot_date": paths.snapshot_date.isoformat(),
                    "cut_off": paths.as_of.isoformat(),
                    "frozen_by_run_id": paths.run_id,
                    "rebuilt": rebuild,
                    "store": {
                        "backend": backend,
                        "url": display_url(settings.live_store_url),
                        "read_from": "store" if standby is None else "standby",
                        "newest_timestamp": newest.isoformat() if newest is not None else None,
                    },
                    "shard_count": plan.shard_count,
                    "eligible_users": plan.eligible_users,
                    "tables": {name: tables[name] for name in SNAPSHOT_SCHEMAS},
                    "row_counts": {name: tables[name]["rows"] for name in SNAPSHOT_SCHEMAS},
                    "follow_edges_by_status": by_status,
                    "follow_edges_shards": shards,
                    "follow_edges_pairs": follow_pairs.PAIRS_CHECKED,
                    "follow_edges_naming_unknown_accounts": unknown.as_dict(),
                    "in_degrees": degrees,
                    "excluded_after_cut_off": dict(sorted(excluded.items())),
                }
                write_json(staging / MANIFEST, document)
                _swap_in(staging, target)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        log.info("retained snapshot %s: %s (left out after the cut-off: %s)",
                 target, document["row_counts"], document["excluded_after_cut_off"])  # fmt: skip
        if unknown.rows:
            log.warning(
                "%d follow edges of the snapshot name an account its users table lacks (e.g. %s): "
                "kept (they only add exclusions); the live store has no foreign keys",
                unknown.rows, unknown.example,
            )  # fmt: skip
        return standby


def refuse_stale(paths: RunPaths, newest: dt.datetime, lag_hours: float) -> None:
    """Raise ``SnapshotNotRetainedError`` when the store's newest timestamp ``newest`` (naive UTC)
    is more than ``lag_hours`` past the run's cut-off: the store no longer shows that date."""
    cut_off = paths.as_of.replace(tzinfo=None)
    if newest <= cut_off + dt.timedelta(hours=lag_hours):
        return
    day = paths.snapshot_date.isoformat()
    raise SnapshotNotRetainedError(
        f"no snapshot of {day} is retained ({folder(paths.home, paths.snapshot_date)}) and the "
        f"live store has moved past its cut-off {cut_off.isoformat()}Z (its newest account "
        f"creation or activity is {newest.isoformat()}Z): a run of that date from it would not "
        "see the graph as it was. Rebuild it from the live store as of the cut-off with "
        '--rebuild-snapshot (DAG run conf {"rebuild_snapshot": true}); a rebuilt snapshot keeps '
        "only rows created by the cut-off and cannot bring back what was removed or changed "
        "since (README, 'Backfills and reruns')"
    )


def write_parquet(frame: pl.DataFrame, contract: dict[str, pl.DataType], path: Path) -> None:
    """Write ``frame`` (checked against ``contract``) with ``PARQUET_OPTIONS``, its string
    columns dictionary-encoded (ids and times are not: their dictionaries cost time, not
    bytes)."""
    check_schema(frame.schema, contract, path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = frame.select(list(contract)).to_arrow().cast(arrow_schema(contract))
    strings = [name for name, dtype in contract.items() if dtype == pl.String]
    pq.write_table(table, path, use_dictionary=strings, **PARQUET_OPTIONS)


def write_in_degrees(frame: pl.DataFrame, folder: Path) -> dict[str, Any]:
    """Write ``in_degrees.frame()`` (sorted by ``user_id``) as ``folder/in_degrees.parquet``;
    returns its manifest entry ``{"path", "rows", "active_follows"}`` (the sum of
    ``in_degree``)."""
    write_parquet(frame, IN_DEGREE_SCHEMA, folder / in_degrees.FILE)
    return {
        "path": in_degrees.FILE,
        "rows": frame.height,
        "active_follows": int(frame.get_column("in_degree").sum()),
    }


def shard_path(shard_id: int) -> str:
    """Relative path of one follow-edge partition inside a snapshot folder."""
    return f"follow_edges/shard_id={shard_id:03d}/part-0.parquet"


def read_follow_edges(
    reader: LiveStoreReader,
    user_ids: pl.Series,
    shard_count: int,
    spill_dir: Path,
    as_of: Callable[[pl.DataFrame, dict[str, int]], pl.DataFrame],
    excluded: dict[str, int],
) -> tuple[dict[int, list[Path]], dict[str, int], follow_pairs.UnknownAccounts]:
    """The store's follow edges, partitioned by shard as they are read (``partition_by_shard``):
    each part the reader offers (``iter_ranges`` of ``follower_id``: one per connection, all in
    one snapshot) is read, refused if an id is NULL, filtered by ``as_of(chunk, left_out)``,
    tallied (``UnknownAccounts`` of ``user_ids``) and spilled on a thread of its own (the
    driver, Arrow's casts and the spill release the GIL: 50 M edges read in about half the
    time on 2 connections, ``bench/README.md``). A range that fails (or an interrupt of the
    caller) stops the others at their next chunk; once all have stopped, the error of the
    lowest-numbered failed range is raised. Returns each shard's spill files in key order
    (range by range), rows per status and the unknown accounts; adds the rows ``as_of`` left
    out to ``excluded["follow_edges"]``."""
    live = follow_pairs.LIVE_STORE
    stop = threading.Event()
    ranges = reader.iter_ranges("follow_edges", "follower_id")

    def partition(number: int, frames: Iterator[pl.DataFrame]):
        unknown = follow_pairs.UnknownAccounts(user_ids)
        left_out: dict[str, int] = {}

        def chunks() -> Iterator[pl.DataFrame]:
            for chunk in frames:
                if stop.is_set():
                    return  # another range failed: this one's rows are not needed
                yield unknown.tally(as_of(follow_pairs.refuse_nulls(chunk, live), left_out))

        spill = spill_dir / f"range-{number:02d}"
        return (*partition_by_shard(chunks(), shard_count, spill, live), unknown, left_out)

    with ThreadPoolExecutor(len(ranges), thread_name_prefix="recs-snap-read") as pool:
        futures = [pool.submit(partition, number, frames) for number, frames in enumerate(ranges)]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:  # all done, one failed, or this thread was interrupted: the others stop
            stop.set()  # at their next chunk (the pool waits for them)
    errors = [future.exception() for future in futures if future.exception() is not None]
    if errors:
        raise errors[0]
    results = [future.result() for future in futures]
    parts = {
        shard_id: [path for result in results for path in result[0].get(shard_id, [])]
        for shard_id in sorted({shard_id for result in results for shard_id in result[0]})
    }
    by_status = sum((Counter(result[1]) for result in results), Counter())
    excluded["follow_edges"] = excluded.get("follow_edges", 0) + sum(
        result[3].get("follow_edges", 0) for result in results
    )
    unknown = results[0][2]
    for result in results[1:]:
        unknown.add(result[2])
    return parts, dict(sorted(by_status.items())), unknown


def partition_by_shard(
    chunks: Iterator[pl.DataFrame], shard_count: int, spill_dir: Path, origin: follow_pairs.Origin
) -> tuple[dict[int, list[Path]], dict[str, int]]:
    """Split follow-edge chunks by ``shard_of(follower_id)`` as they are read, each shard's
    piece of each chunk appended to that shard's Arrow IPC stream ``spill_dir/NNN.arrows``
    (uncompressed, one record batch per chunk), so memory holds one chunk, not the table;
    returns each shard's spill file (a one-item list) and the row count per ``status``. The
    caller removes ``spill_dir``. Chunk by chunk: a global ``partition_by`` doubles peak memory;
    a stream per shard, not a file per piece: files are dear to make and remove here, ~800 of
    them at 50 M edges (``bench/README.md``). A NULL id (no shard to file it under) is
    ``follow_pairs.refuse_nulls``' error, naming ``origin``."""
    parts: dict[int, list[Path]] = {}
    by_status: dict[str, int] = {}
    streams: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
    schemas: dict[int, pa.Schema] = {}  # each stream's, as its first piece had it
    spill_dir.mkdir(parents=True, exist_ok=True)
    # every file and writer closed on the way out, also when the read fails (a writer opened
    # on a path keeps its file open until it is collected; an error's traceback holds it)
    with ExitStack() as opened:
        for chunk in chunks:
            follow_pairs.refuse_nulls(chunk, origin)
            for status, count in chunk.group_by("status").len().iter_rows():
                by_status[status] = by_status.get(status, 0) + count
            keyed = chunk.with_columns(shard_expr("follower_id", shard_count).alias("_shard"))
            for key, part in keyed.partition_by("_shard", as_dict=True, include_key=False).items():
                shard_id = int(key[0])
                table = part.to_arrow(compat_level=pl.CompatLevel.newest())
                if shard_id not in streams:
                    path = spill_dir / f"{shard_id:03d}.arrows"
                    sink = opened.enter_context(pa.OSFile(str(path), "wb"))
                    streams[shard_id] = opened.enter_context(pa.ipc.new_stream(sink, table.schema))
                    schemas[shard_id] = table.schema
                    parts[shard_id] = [path]
                streams[shard_id].write_table(table.cast(schemas[shard_id]))
    return parts, dict(sorted(by_status.items()))


def write_follow_edges(
    parts: dict[int, list[Path]],
    shard_count: int,
    target: Path,
    origin: follow_pairs.Origin,
    counted: in_degrees.InDegrees | None = None,
) -> list[dict[str, Any]]:
    """Write every shard ``0 .. shard_count-1`` (empty ones too) from its spilled streams
    (``partition_by_shard``; one per range of the read, in key order), each in key order and
    checked by ``follow_pairs.checked`` (a ``LiveStoreError`` naming ``origin`` if a pair
    repeats or an id is NULL), its follows added to ``counted`` if given, in a thread pool
    (sorting, encoding and compression release the GIL; memory: ``WRITE_THREADS`` shards at a
    time)."""
    contract = SNAPSHOT_SCHEMAS["follow_edges"]

    def write(shard_id: int) -> dict[str, Any]:
        pieces = [pl.read_ipc_stream(path) for path in parts.get(shard_id, [])]
        part = pl.concat(pieces or [pl.DataFrame(schema=contract)])
        del pieces
        part = follow_pairs.checked(part, shard_id, origin)
        if counted is not None:
            counted.count(part)
        relative = shard_path(shard_id)
        write_parquet(part, contract, target / relative)
        return {"shard_id": shard_id, "path": relative, "rows": part.height}

    with ThreadPoolExecutor(max_workers=WRITE_THREADS, thread_name_prefix="recs-snap") as pool:
        return list(pool.map(write, range(shard_count)))


@contextmanager
def spill_folder(beside: Path) -> Iterator[Path]:
    """A fresh folder for ``partition_by_shard``'s pieces next to ``beside`` (same filesystem),
    removed on exit whatever happens; one left by a killed attempt is removed by the next."""
    beside.parent.mkdir(parents=True, exist_ok=True)
    for leftover in beside.parent.glob(f".{beside.name}.*.spill"):
        shutil.rmtree(leftover, ignore_errors=True)
    folder = beside.with_name(staging_name(beside.name, ".spill"))
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class RetainedFolder:
    """A date's retained snapshot as the run store moves a run's files (``artifacts``):
    ``<home>/snapshots/<date>/`` here, ``<store>/snapshots/<date>/`` there."""

    run_dir: Path
    snapshot_date: dt.date
    run_id: str = "retained snapshot"  # named in the store's messages

    @property
    def store_folder(self) -> str:
        return f"snapshots/{self.snapshot_date.isoformat()}"


def _retained_part() -> Part:
    tables = [f"{name}.parquet" for name in SNAPSHOT_SCHEMAS if name != "follow_edges"]
    # in_degrees.parquet is absent from a snapshot an earlier version retained: a part's root
    # that does not exist covers nothing
    return Part("retained", (*tables, "follow_edges", in_degrees.FILE, MANIFEST))


def from_run_store(home: Path, day: dt.date) -> bool:
    """With a run store holding the date's retained snapshot, and none here or another one
    (another worker froze or rebuilt it): download it whole into a staging folder, swapped in
    under the date's lock; True if it did. So a backfill on any worker reuses the date's rows
    as the machine that last froze them made them. Raises ``RunStoreError``,
    ``ArtifactNotFoundError`` (a file changed while it was read)."""
    store = run_store()
    if store is None:
        return False
    target = folder(home, day)
    with _date_lock(target):
        where = RetainedFolder(target, day)
        document = store.marker(where, _retained_part())
        if document is None or _held_manifest(document) == _local_manifest(target):
            return False
        staging = target.with_name(staging_name(target.name, ".partial"))
        try:
            store.fetch(
                where, document["files"], staging, _retained_part(),
                rewrite=f"rerun freeze_snapshot of {day} on a machine whose snapshots/{day}/ is "
                "whole",
            )  # fmt: skip
            _swap_in(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log.info("retained snapshot %s downloaded from the run store %s", target, store.url)
    return True


def to_run_store(home: Path, day: dt.date, *, replace: bool) -> None:
    """With a run store: push the date's retained snapshot there if the store has none, or if
    ``replace`` (this machine just froze or rebuilt it) and the store holds another one; under
    the date's lock. A machine reusing an older copy never overwrites a newer freeze. Raises
    ``RunStoreError``."""
    store = run_store()
    if store is None:
        return
    target = folder(home, day)
    with _date_lock(target):
        local = _local_manifest(target)
        if local is None:
            return
        where = RetainedFolder(target, day)
        document = store.marker(where, _retained_part())
        if document is None or (replace and _held_manifest(document) != local):
            store.push(where, _retained_part())


@contextmanager
def reading(target: Path) -> Iterator[bool]:
    """Hold the retained folder ``target`` for reading (the date lock, shared): no freeze,
    download or ``recs gc`` of that date changes or removes it meanwhile (gc leaves a date whose
    lock it cannot take). Yields whether the folder is whole (``is_complete``), judged under the
    lock: gc may have removed it between a caller's look and this lock (a review: a backfill
    that found its snapshot then lost it mid-link)."""
    with _date_lock(target, shared=True):
        yield is_complete(target)


def _held_manifest(document: dict[str, Any]) -> str | None:
    return document["files"].get(MANIFEST, {}).get("sha256")


def _local_manifest(target: Path) -> str | None:
    return sha256_file(target / MANIFEST) if is_complete(target) else None


def _swap_in(staging: Path, target: Path) -> None:
    """Make ``staging`` the retained folder ``target`` (an old one is moved aside, then gone)."""
    aside = target.with_name(staging_name(target.name, ".old"))
    if target.exists():
        os.rename(target, aside)
    os.rename(staging, target)
    shutil.rmtree(aside, ignore_errors=True)


LOCK_ATTEMPTS = 100
"""How many times in a row ``_date_lock`` takes a lock on a file no longer at its path before
it gives up (gc, or an exclusive holder leaving the date with no folder, removes the file, each
time after a holder: a review's 250 threads contending for one date needed 89 at most; only a
filesystem whose inode numbers are not stable would move it every time)."""


@contextmanager
def _date_lock(target: Path, *, shared: bool = False) -> Iterator[None]:
    """One freeze of a date at a time (waits): ``snapshots/.<date>.lock``; ``shared``, for runs
    that read the retained folder (``reading``), which may read it together but not while it is
    written or removed. ``recs gc`` deletes the lock file of a date it removes (``remove``), and
    an exclusive holder the lock file of a date it leaves with no folder (a freeze refused or
    failed), so a lock won on a file no longer at that path is let go and taken again on the
    file that is, up to ``LOCK_ATTEMPTS`` times (``OSError`` after). Not re-entrant: a process
    holding one date lock must not ask for another of the same date (it would wait on
    itself)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_file(target)
    for _ in range(LOCK_ATTEMPTS):
        with lock.open("a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            if not still_at(handle, lock):
                continue  # removed while we waited: whoever opens it now must see our lock
            try:
                yield
            finally:
                try:  # a date left with no folder (a refused freeze) keeps no lock file either
                    if not shared and not os.path.lexists(target):
                        lock.unlink(missing_ok=True)  # still held: a waiter retries (as gc's)
                finally:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return
    raise OSError(
        f"cannot hold the lock {lock}: the file at that path was another one each time it was "
        f"locked ({LOCK_ATTEMPTS} times in a row); keep RECS_HOME on a filesystem whose inode "
        "numbers are stable"
    )
