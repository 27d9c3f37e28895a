"""This machine's copy of a run's capped CSR graph, downloaded once from the run store.

ARCHITECTURE §6: "the per-run CSR graph is built once, copied to each worker node,
memory-mapped read-only". With a run store (``recs.nightly.artifacts``), ``traverse_shard``
memory-maps the graph from here instead of the run folder::

    <run_cache_dir>/<snapshot_date>/<run_id>/<checksum>/graph/*.npy, meta.json
    <run_cache_dir>/<snapshot_date>/<run_id>/.lock

(``run_cache_dir``: ``Settings.run_cache_dir``, default ``<home>/cache/graphs``). The key is the
run and the graph's content, the ``checksum`` of its marker in the store: a rebuilt graph with
other bytes is downloaded again, an identical one is not. The first shard task on a machine
downloads it under the run's ``flock`` (blocking: the machine's other shard tasks of the run wait
for it, then reuse it), into a staging folder, each file checked against the marker's size and
sha256, then renamed into place, so a half-downloaded copy never looks complete.

A machine keeps one run's graph (at the design's scale one is about 100 GB): once a new copy is
in place, the run's older graphs and every other run's copy are removed, except a run whose lock
another task holds (it is downloading); a task still mapping a removed copy keeps its pages
(Linux frees an unlinked file once the last mapping goes). Not covered: a task handed a copy
that it has not mapped yet, when another run's download on the same machine removes it in
between; it fails with "missing graph file" and its retry downloads the graph again. The
nightly DAG runs one run at a time (``max_active_runs=1``), so it takes a rerun of an older
run's shard during a night; that rerun downloads its graph again too.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from recs.config import get_settings
from recs.errors import ArtifactNotFoundError
from recs.files import staging_name
from recs.nightly.artifacts import GRAPH, RunStore
from recs.nightly.runs import RunPaths

log = logging.getLogger("recs.nightly.graph_cache")

KEY_LENGTH = 32
"""Hex digits of the checksum naming a cached copy (128 bits)."""


@dataclass(frozen=True)
class CachedGraph:
    """A cached copy: ``graph_dir`` (what ``load_graph`` maps), its ``checksum`` and whether
    this call ``downloaded`` it (False: an earlier task on this machine did)."""

    graph_dir: Path
    checksum: str
    downloaded: bool


def cache_root(paths: RunPaths) -> Path:
    """The machine's graph cache: ``Settings.run_cache_dir`` or ``<home>/cache/graphs``."""
    return Path(get_settings().run_cache_dir or Path(paths.home) / "cache" / "graphs")


def local_graph(store: RunStore, paths: RunPaths, root: Path | None = None) -> CachedGraph:
    """The run's graph on this machine (module docstring), downloaded if no task here has yet.
    Raises ``ArtifactNotFoundError`` when the store has no complete graph of the run (or a file
    changed while it was read) and ``RunStoreError``."""
    marker = store.marker(paths, GRAPH)
    if marker is None:
        raise ArtifactNotFoundError(
            f"run {paths.run_id} of {paths.snapshot_date} has no complete graph in the run store "
            f"{store.url}: build_graph has not succeeded there"
        )
    checksum = marker["checksum"]
    run_cache = (root or cache_root(paths)) / paths.snapshot_date.isoformat() / paths.run_id
    final = run_cache / checksum[:KEY_LENGTH]
    run_cache.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(run_cache / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # waits for a download in progress here
        if final.is_dir():
            return CachedGraph(final / "graph", checksum, downloaded=False)
        staging = run_cache / staging_name(final.name, ".partial")
        try:
            store.fetch(paths, marker["files"], staging)
            os.rename(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for other in run_cache.iterdir():  # older graphs of the run, a killed download's pieces
            if other.name != final.name and other.name != ".lock":
                shutil.rmtree(other, ignore_errors=True)
        _remove_other_runs(run_cache.parent.parent, run_cache)
        size = sum(entry["size"] for entry in marker["files"].values())
        log.info("graph of %s copied to %s (%d bytes)", paths.run_id, final, size)
        return CachedGraph(final / "graph", checksum, downloaded=True)
    finally:
        os.close(descriptor)  # releases the lock


def _remove_other_runs(root: Path, keep: Path) -> list[Path]:
    """Remove the cached graphs of every run under ``root`` but ``keep``, each under its own
    lock taken without waiting (a run whose lock is held is left alone). Returns what went."""
    removed = []
    for run_cache in sorted(root.glob("*/*")):
        if run_cache == keep or not run_cache.is_dir():
            continue
        descriptor = os.open(run_cache / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        else:
            shutil.rmtree(run_cache, ignore_errors=True)
            removed.append(run_cache)
        finally:
            os.close(descriptor)
    for date_dir in root.iterdir():
        try:
            date_dir.rmdir()  # only if empty: a date with a run left keeps its folder
        except OSError:
            pass
    if removed:
        log.info("graph cache %s: removed the copies of %s", root, [p.name for p in removed])
    return removed
