"""freeze_snapshot: a consistent, non-blocking copy of the live store into the run's Parquet.

Every table is read in one read transaction (``recs.store.readers.open_reader``), from the
primary or from a hot standby of it (``recs.store.standby.snapshot_source``), so the snapshot is
the store at a single instant while follows keep arriving, and no writer waits for it. Follow
edges are partitioned by shard chunk by chunk as they are read, then each shard is sorted and
written in a thread pool.

Output (``paths.snapshot_dir``, contracts.SNAPSHOT_SCHEMAS)::

    users.parquet  blocks.parquet  mutes.parquet  dismissed_candidates.parquet
    user_interests.parquet
    follow_edges/shard_id=000/part-0.parquet ... shard_id=<S-1>/part-0.parquet
    manifest.json

Every shard folder exists even when empty; ``shard_id`` is only in the folder name. Rows are
sorted by their key and written with fixed Parquet options (``PARQUET_OPTIONS``), so a rerun of
the same store writes identical bytes (with the pinned pyarrow: its version is in the footer).
Outputs are staged in a sibling folder and swapped in at the end: a failed snapshot never
leaves a half-written ``snapshot/`` with a manifest. Measured speeds: ``bench/README.md``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from recs.config import Settings
from recs.contracts import SNAPSHOT_SCHEMAS, arrow_schema, check_schema
from recs.errors import LiveStoreError
from recs.files import write_json
from recs.nightly.runs import RunPaths
from recs.sharding import shard_expr
from recs.store.connections import display_url, one_line
from recs.store.readers import open_reader
from recs.store.standby import snapshot_source

log = logging.getLogger("recs.nightly.snapshot")

SORT_KEYS: dict[str, list[str]] = {
    "users": ["user_id"],
    "follow_edges": ["follower_id", "followee_id"],
    "blocks": ["blocker_id", "blocked_id"],
    "mutes": ["muter_id", "muted_id"],
    "dismissed_candidates": ["user_id", "candidate_id"],
    "user_interests": ["user_id", "tag"],
}
"""The key of each snapshot table: its primary key in the store, and its sort order on disk."""

PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "row_group_size": 1 << 20,
    "use_dictionary": True,
    "write_statistics": True,
    "version": "2.6",
    "data_page_version": "1.0",
}
"""Fixed ``pyarrow.parquet.write_table`` options: the same rows always give the same bytes."""

WRITE_THREADS = min(8, os.cpu_count() or 1)
"""Shard files written concurrently (the bytes of each file do not depend on it)."""


def _write_parquet(frame: pl.DataFrame, contract: dict[str, pl.DataType], path: Path) -> None:
    check_schema(frame.schema, contract, path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = frame.select(list(contract)).to_arrow().cast(arrow_schema(contract))
    pq.write_table(table, path, **PARQUET_OPTIONS)


def shard_path(shard_id: int) -> str:
    """Relative path of one follow-edge partition inside the snapshot folder."""
    return f"follow_edges/shard_id={shard_id:03d}/part-0.parquet"


def _partition_by_shard(
    chunks: Iterator[pl.DataFrame], shard_count: int
) -> tuple[dict[int, list[pl.DataFrame]], dict[str, int]]:
    """Split follow-edge chunks by ``shard_of(follower_id)`` as they are read.

    Returns the unsorted pieces of each shard and the row count per ``status``. Chunk by chunk,
    not the whole table: a global ``partition_by`` doubles peak memory (``bench/README.md``).
    """
    parts: dict[int, list[pl.DataFrame]] = {}
    by_status: dict[str, int] = {}
    for chunk in chunks:
        for status, count in chunk.group_by("status").len().iter_rows():
            by_status[status] = by_status.get(status, 0) + count
        keyed = chunk.with_columns(shard_expr("follower_id", shard_count).alias("_shard"))
        for key, part in keyed.partition_by("_shard", as_dict=True, include_key=False).items():
            parts.setdefault(int(key[0]), []).append(part)
    return parts, dict(sorted(by_status.items()))


def _write_follow_edges(
    parts: dict[int, list[pl.DataFrame]], shard_count: int, folder: Path
) -> list[dict[str, Any]]:
    """Write every shard ``0 .. shard_count-1`` (empty ones too), each sorted by its key.

    Consumes ``parts`` (each shard is released once written). Each shard is sorted and written
    in the thread pool, faster than one global sort then the writes (``bench/README.md``).
    """
    contract = SNAPSHOT_SCHEMAS["follow_edges"]
    empty = [pl.DataFrame(schema=contract)]

    def write(shard_id: int) -> dict[str, Any]:
        part = pl.concat(parts.pop(shard_id, empty)).sort(SORT_KEYS["follow_edges"])
        relative = shard_path(shard_id)
        _write_parquet(part, contract, folder / relative)
        log.info("wrote follow_edges shard %03d: %d rows", shard_id, part.height)
        return {"shard_id": shard_id, "path": relative, "rows": part.height}

    # Sorting, Parquet encoding and compression release the GIL: shards are done side by side.
    with ThreadPoolExecutor(max_workers=WRITE_THREADS, thread_name_prefix="recs-snap") as pool:
        return list(pool.map(write, range(shard_count)))


def freeze_snapshot(paths: RunPaths, settings: Settings) -> dict[str, Any]:
    """Copy the live store into ``paths.snapshot_dir`` as Parquet, consistently, without locks.

    Reads every table of ``SNAPSHOT_SCHEMAS`` in one read transaction (``open_reader``), then
    writes ``users``, ``blocks``, ``mutes``, ``dismissed_candidates``, ``user_interests`` as
    one file each and ``follow_edges`` as ``settings.shard_count`` partitions by
    ``recs.sharding.shard_of(follower_id)``, rows sorted by ``SORT_KEYS``. Then writes
    ``paths.snapshot_manifest``: ``snapshot_date``, ``run_id``, ``as_of``, ``shard_count``,
    ``store`` (backend, URL without password), ``tables`` (path and rows per table),
    ``row_counts``, ``follow_edges_by_status``, ``follow_edges_shards`` (path and rows per
    shard) and ``settings`` (``settings.model_dump(mode="json")``, which
    ``Settings.model_validate`` turns back into equal settings: ``pipeline.run_settings``).
    The manifest holds no timings, so a rerun writes identical bytes.

    Reads ``settings.snapshot_store_url`` when set (a hot standby of the PostgreSQL primary
    ``store_url``: the batch's read load then never reaches the primary the write path uses),
    after ``wait_for_standby`` has seen it replay everything the primary had committed when the
    freeze started; else ``store_url`` (``snapshot_source``).

    Replaces a previous snapshot of the same run. Returns ``snapshot_dir``, ``manifest``
    (str paths), ``row_counts``, ``shard_count``, ``seconds``, ``read_seconds``,
    ``write_seconds``, ``standby`` (``wait_for_standby``'s result, or None). Raises
    ``LiveStoreError`` if the store is missing or lacks a table, a read fails (e.g. a standby
    cancelling it on a recovery conflict), or the standby is wrong or lags.
    """
    started = time.perf_counter()
    url, standby = snapshot_source(settings)
    if standby is not None:
        log.info("snapshot standby caught up with the primary: %s", standby)
    frames: dict[str, pl.DataFrame] = {}
    with open_reader(url) as reader:
        backend = reader.backend
        try:
            for name in SNAPSHOT_SCHEMAS:  # users first, then follow_edges, ...: one transaction
                if name == "follow_edges":
                    parts, by_status = _partition_by_shard(
                        reader.iter_table(name), settings.shard_count
                    )
                else:
                    frames[name] = reader.read_table(name)
        except (LiveStoreError, MemoryError):
            raise
        except Exception as error:  # noqa: BLE001 - a driver error mid-read: one line, not a trace
            message = one_line(error, url, limit=300)
            raise LiveStoreError(
                f"reading the live store {display_url(url)} failed (the run can be retried): "
                f"{message}"
            ) from error
    read_seconds = time.perf_counter() - started

    t0 = time.perf_counter()
    final = paths.snapshot_dir
    staging = final.with_name(f".{final.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    tables: dict[str, dict[str, Any]] = {}
    for name, frame in frames.items():
        relative = f"{name}.parquet"
        _write_parquet(frame.sort(SORT_KEYS[name]), SNAPSHOT_SCHEMAS[name], staging / relative)
        tables[name] = {"path": relative, "rows": frame.height}
        log.info("wrote %s: %d rows", name, frame.height)
    shards = _write_follow_edges(parts, settings.shard_count, staging)
    tables["follow_edges"] = {"path": "follow_edges", "rows": sum(s["rows"] for s in shards)}
    row_counts = {name: tables[name]["rows"] for name in SNAPSHOT_SCHEMAS}
    manifest = {
        "snapshot_date": paths.snapshot_date.isoformat(),
        "run_id": paths.run_id,
        "as_of": paths.as_of.isoformat(),
        "shard_count": settings.shard_count,
        "store": {
            "backend": backend,
            "url": display_url(settings.live_store_url),
            "read_from": "store" if standby is None else "standby",
        },
        "tables": {name: tables[name] for name in SNAPSHOT_SCHEMAS},
        "row_counts": row_counts,
        "follow_edges_by_status": by_status,
        "follow_edges_shards": shards,
        "settings": settings.model_dump(mode="json"),
    }
    write_json(staging / paths.snapshot_manifest.name, manifest)
    if final.exists():
        shutil.rmtree(final)
    staging.rename(final)
    write_seconds = time.perf_counter() - t0
    seconds = time.perf_counter() - started
    log.info(
        "snapshot %s/%s: %s in %.1f s (read %.1f s, write %.1f s)",
        paths.snapshot_date,
        paths.run_id,
        row_counts,
        seconds,
        read_seconds,
        write_seconds,
    )
    return {
        "snapshot_dir": str(final),
        "manifest": str(paths.snapshot_manifest),
        "row_counts": row_counts,
        "shard_count": settings.shard_count,
        "seconds": round(seconds, 3),
        "read_seconds": round(read_seconds, 3),
        "write_seconds": round(write_seconds, 3),
        "standby": standby,
    }
