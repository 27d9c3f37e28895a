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
sha256, then renamed into place, so a half-downloaded copy never looks complete. Each task first
checks the copy against what its download left (``STAMP``: each file's size and mtime, a
``stat`` each): a copy damaged here since is downloaded again and its files replaced one by
one (``os.replace``), so a task that holds the copy never finds a file missing.

A machine keeps one run's graph (at the design's scale one is about 100 GB): once a new copy is
in place, the run's older graphs and every other run's copy are removed, except a copy a task is
using. A task uses a copy inside ``local_graph``'s ``with``: from before it looks for the copy
until the task ends it holds a shared ``flock`` on ``<checksum>.inuse`` beside the copy, and a
copy is removed only under that lock taken exclusively without waiting (a run whose ``.lock``
another task holds, downloading, is left alone too). So a copy is never removed between being
handed to a task and being mapped by it; once mapped, Linux keeps an unlinked file's pages
until the last mapping goes. Each lock is checked, once held, to still be the file at its path
(``_held``): a lock file removed with its copy meanwhile is opened again.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from recs.config import get_settings
from recs.errors import ArtifactNotFoundError
from recs.files import staging_name
from recs.nightly.artifacts import GRAPH, RunStore
from recs.nightly.entries import file_entry, same_file
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


@contextmanager
def local_graph(
    store: RunStore, paths: RunPaths, root: Path | None = None
) -> Iterator[CachedGraph]:
    """The run's graph on this machine (module docstring), downloaded if no task here has yet,
    in use (never removed) until the ``with`` ends. Raises ``ArtifactNotFoundError`` when the
    store has no complete graph of the run (or a file changed while it was read) and
    ``RunStoreError``."""
    marker = store.marker(paths, GRAPH)
    if marker is None:
        raise ArtifactNotFoundError(
            f"run {paths.run_id} of {paths.snapshot_date} has no complete graph in the run store "
            f"{store.url}: build_graph has not succeeded there"
        )
    checksum = marker["checksum"]
    run_cache = (root or cache_root(paths)) / paths.snapshot_date.isoformat() / paths.run_id
    final = run_cache / checksum[:KEY_LENGTH]
    with _held(_in_use(final), fcntl.LOCK_SH):  # in use from here: never removed under us
        with _held(run_cache / LOCK, fcntl.LOCK_EX):  # waits for a download in progress here
            downloaded = not _intact(final, marker["files"])
            if downloaded:
                staging = run_cache / staging_name(final.name, ".partial")
                try:
                    store.fetch(paths, marker["files"], staging, GRAPH)
                    _stamp(staging, marker["files"])
                    if final.exists():  # damaged here: mended file by file, never missing
                        log.warning(
                            "graph copy %s is not the one downloaded (a file missing, resized "
                            "or rewritten here): downloading it again", final,
                        )  # fmt: skip
                        for name in [*marker["files"], STAMP]:
                            (final / name).parent.mkdir(parents=True, exist_ok=True)
                            os.replace(staging / name, final / name)
                    else:
                        os.rename(staging, final)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
                for other in sorted(run_cache.iterdir()):  # older graphs, killed downloads
                    if other.is_dir() and other != final:
                        _remove_copy(other)
                _remove_other_runs(run_cache.parent.parent, run_cache)
                size = sum(entry["size"] for entry in marker["files"].values())
                log.info("graph of %s copied to %s (%d bytes)", paths.run_id, final, size)
        yield CachedGraph(final / "graph", checksum, downloaded=downloaded)


LOCK = ".lock"
"""A run's download lock in its cache folder."""


STAMP = ".copied.json"
"""In a copy: each file's size and mtime as the download left them (``_stamp``)."""


def _stamp(copy: Path, files: dict[str, dict]) -> None:
    """Write ``copy``'s ``STAMP``: the size and mtime of each of the marker's ``files`` there."""
    stamp = {name: file_entry(copy / name, checksum=False) for name in files}
    (copy / STAMP).write_text(json.dumps(stamp, sort_keys=True))


def _intact(copy: Path, files: dict[str, dict]) -> bool:
    """Whether ``copy`` holds every file of the marker ``files`` as its download left them:
    the same size and mtime as its ``STAMP`` records (a ``stat`` each, nothing read), so a
    file removed or rewritten here since is found, and a graph rebuilt with the same bytes
    (same checksum, other mtimes in its marker) is not downloaded again."""
    try:
        stamp = json.loads((copy / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return set(stamp) == set(files) and all(
        isinstance(entry, dict) and same_file(copy / name, entry) for name, entry in stamp.items()
    )


def _in_use(copy: Path) -> Path:
    """The lock file a task holds shared while it uses ``copy`` (beside it, not inside)."""
    return copy.with_name(f"{copy.name}.inuse")


@contextmanager
def _held(path: Path, operation: int) -> Iterator[bool]:
    """Hold ``flock(operation)`` on ``path`` (created, with its folder, if missing) for the
    ``with``; yields False instead of waiting when ``operation`` has ``LOCK_NB`` and the lock is
    taken. A lock file unlinked by a remover between the open and the lock is opened again, so
    what is held is always the file at ``path``."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # its folder was removed between the two calls
            continue
        try:
            try:
                fcntl.flock(descriptor, operation)
            except BlockingIOError:
                yield False
                return
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(descriptor).st_ino:
                yield True
                return
        finally:
            os.close(descriptor)


def _remove_copy(copy: Path) -> bool:
    """Remove a cached copy (or a killed download's staging folder) and its in-use lock unless
    a task holds that lock; True if it went."""
    with _held(_in_use(copy), fcntl.LOCK_EX | fcntl.LOCK_NB) as free:
        if not free:
            return False
        shutil.rmtree(copy, ignore_errors=True)
        _in_use(copy).unlink(missing_ok=True)
        return True


def _remove_lock(path: Path) -> bool:
    """Remove an in-use lock file left without its copy, unless a task holds it."""
    with _held(path, fcntl.LOCK_EX | fcntl.LOCK_NB) as free:
        if free:
            path.unlink(missing_ok=True)
        return free


def _remove_other_runs(root: Path, keep: Path) -> list[Path]:
    """Remove the cached graphs of every run under ``root`` but ``keep`` that no task uses,
    each run under its own lock taken without waiting (a run whose lock is held, downloading,
    is left alone); a run folder goes once its copies have. Returns the runs that went."""
    removed = []
    for run_cache in sorted(root.glob("*/*")):
        if run_cache == keep or not run_cache.is_dir():
            continue
        with _held(run_cache / LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB) as free:
            if not free:
                continue
            copies = [p for p in run_cache.iterdir() if p.is_dir()]
            uses = [p for p in run_cache.glob("*.inuse") if p.with_suffix("") not in copies]
            if all([_remove_copy(copy) for copy in copies] + [_remove_lock(p) for p in uses]):
                (run_cache / LOCK).unlink(missing_ok=True)
                try:
                    run_cache.rmdir()
                except OSError:  # a task arrived meanwhile: it opens the lock again (_held)
                    continue
                removed.append(run_cache)
    for date_dir in root.iterdir():
        try:
            date_dir.rmdir()  # only if empty: a date with a run left keeps its folder
        except OSError:
            pass
    if removed:
        log.info("graph cache %s: removed the copies of %s", root, [p.name for p in removed])
    return removed
