"""Who may work on a run right now: a run lock, and a lock per shard (and per graph piece).

A stage that writes the run's shared outputs (snapshot, dbt build, graph, gate) holds the run's lock
exclusively; a shard task holds it shared (the shards of one run run side by side) plus its shard's
lock exclusively. Both are ``flock``s on files in the run folder (``.lock``, ``.locks/``), taken
without waiting: a second process that wants a lock someone holds is refused at once with
``RunInProgressError`` ("run … is in progress"), before it writes anything (after a few
milliseconds' retries, the most a probe of ``in_progress`` holds a lock). A process that already
holds a lock (``recs run`` holds the run's exclusively for the whole run) takes the inner ones for
free. The kernel drops the locks of a process that dies, so a killed run never leaves a stale lock
behind.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recs.errors import RecsError, RunInProgressError
from recs.nightly.runs import RunPaths

_held: dict[Path, str] = {}  # lock file -> "exclusive" | "shared", held by this process
_guard = threading.Lock()


@contextmanager
def run_lock(paths: RunPaths, *, shared: bool = False) -> Iterator[None]:
    """Hold the run's lock (``<run_dir>/.lock``) for the block; ``shared`` for a shard task.
    Raises ``RunInProgressError`` if another process holds it in a conflicting mode."""
    with _flock(paths.run_dir / ".lock", shared, f"run {paths.run_id} of {paths.snapshot_date}"):
        yield


@contextmanager
def shard_lock(paths: RunPaths, shard_id: int) -> Iterator[None]:
    """Hold the run's lock shared and shard ``shard_id``'s exclusively for the block."""
    what = f"shard {shard_id:03d} of run {paths.run_id} of {paths.snapshot_date}"
    with run_lock(paths, shared=True):
        with _flock(paths.run_dir / ".locks" / f"shard_id={shard_id:03d}.lock", False, what):
            yield


@contextmanager
def graph_piece_lock(paths: RunPaths, shard_id: int) -> Iterator[None]:
    """Hold the run's lock shared and partition ``shard_id``'s graph piece exclusively for the
    block (``cap_graph``: the pieces of one run are capped side by side)."""
    what = f"graph piece {shard_id:03d} of run {paths.run_id} of {paths.snapshot_date}"
    with run_lock(paths, shared=True):
        lock = paths.run_dir / ".locks" / f"graph_shard_id={shard_id:03d}.lock"
        with _flock(lock, False, what):
            yield


def in_progress(run_dir: Path) -> bool:
    """Whether some process holds the lock of the run in ``run_dir`` now (``held``; ``recs
    gc`` leaves such a run alone; ``recs summary`` says so). Raises ``OSError`` for a lock file
    it may not read."""
    return held(Path(run_dir) / ".lock")


def held(lock: Path) -> bool:
    """Whether some process holds the flock of the file ``lock`` now, shared or exclusive
    (without creating the file, so asking changes nothing). Opened read-only: a home mounted
    read-only can be asked too (a review: summary failed there). The probe holds the lock for
    microseconds; a process taking it meanwhile tries again (``_locked``). Raises ``OSError``
    for a lock file it may not read."""
    try:
        descriptor = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)  # also releases the lock if we got it
    return False


@contextmanager
def _flock(path: Path, shared: bool, what: str) -> Iterator[None]:
    path = path.resolve()
    with _guard:
        mode = _held.get(path)
    if mode == "exclusive" or (mode == "shared" and shared):
        yield  # this process holds it already (recs run, or a stage inside it)
        return
    descriptor = _locked(path, shared, what)
    try:
        with _guard:
            _held[path] = "shared" if shared else "exclusive"
        try:
            yield
        finally:
            with _guard:
                _held.pop(path, None)
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def _locked(path: Path, shared: bool, what: str) -> int:
    """A descriptor of ``path`` holding its ``flock`` (``RunInProgressError`` when another
    process holds it). The lock counts only while ``path`` still names the file locked: a run
    that never froze its snapshot removes its folder, ``.lock`` with it, still holding the lock
    (``pipeline.run_all``), and a process that opened the old file meanwhile would lock a file
    no other process can see; it opens the new one instead, and so does one whose folder went
    between its ``mkdir`` and ``open`` (the check-after-lock of ``flock(2)`` lock files)."""
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    for _ in range(100):  # each turn means another process removed the folder just now
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            continue  # a parent removed between mkdir and open
        except (FileExistsError, NotADirectoryError):
            blocking = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
            if blocking is not None and not blocking.is_dir():
                raise RecsError(
                    f"{what}: {blocking} is a file, where a folder of the run goes: move it"
                ) from None
            continue  # removed inside mkdir (its mkdir(2) saw EEXIST, then is_dir did not)
        try:
            _flock_or_wait_out_a_probe(descriptor, mode)
        except BlockingIOError:
            os.close(descriptor)
            raise RunInProgressError(
                f"{what} is in progress in another process (it holds {path}): wait for it to "
                "finish, or use another --run-id"
            ) from None
        try:
            named = os.stat(path)
        except FileNotFoundError:
            named = None
        held = os.fstat(descriptor)
        if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            return descriptor
        os.close(descriptor)  # an unlinked file: its lock guards nothing (closing releases it)
    raise RunInProgressError(f"{what}: its lock file {path} keeps being removed; try again")


PROBE_TRIES = 5
PROBE_PAUSE_SECONDS = 0.01
"""``in_progress`` (``recs gc``, ``recs summary``) takes a run's lock for microseconds to ask
whether it is held: a process wanting the lock just then tries ``PROBE_TRIES`` times,
``PROBE_PAUSE_SECONDS`` apart, before it is refused (a holder that is working holds it for
seconds at least)."""


def _flock_or_wait_out_a_probe(descriptor: int, mode: int) -> None:
    """``flock(descriptor, mode)`` (non-blocking), tried ``PROBE_TRIES`` times; raises
    ``BlockingIOError`` if the lock was held every time."""
    for attempt in range(PROBE_TRIES):
        try:
            fcntl.flock(descriptor, mode)
            return
        except BlockingIOError:
            if attempt == PROBE_TRIES - 1:
                raise
            time.sleep(PROBE_PAUSE_SECONDS)
