"""Removing retained snapshots (``recs gc``): the per-date lock file, how old a folder's
contents are, and the removal itself.

``retained`` freezes a date under ``snapshots/.<date>.lock`` (``lock_file``), and a run links it
into its own folder holding that lock shared (``retained.reading``); ``remove`` takes
the same lock without waiting, judges the folder's age under it (``changed_since``) and renames
the folder aside before deleting it (``recs.files.remove_folder``). The rules of retention
(which dates, which ages) are ``retention``'s.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import Any

from recs.files import remove_folder
from recs.nightly.locks import held

REMOVED, NO_FOLDER, BUSY, RECENT = "removed", "no folder", "busy", "recent"
"""What ``remove`` did: removed the folder (and the lock file), found only the lock file (or
nothing: another gc removed it first), left both (a run freezing or reading the date holds the
lock), or left both because the folder was written after ``unchanged_since``."""


def changed_since(target: Path, timestamp: float) -> bool:
    """Whether anything directly in the retained folder ``target`` was written after
    ``timestamp`` (seconds since the epoch): each entry's own modification time, links not
    followed. Not the folder's own time, which moves when a file in it is deleted (a review:
    a half-removed snapshot would have looked fresh). Raises ``OSError`` if the folder cannot
    be listed."""
    return any(entry.lstat().st_mtime > timestamp for entry in target.iterdir())


def remove(home: Path, name: str, *, unchanged_since: float | None = None) -> str:
    """Remove the retained snapshot ``snapshots/<name>/`` (if any) and its lock file, holding
    that lock, taken without waiting (``recs gc``; without it, the lock files of every date
    ever frozen stay); with ``unchanged_since``, only if nothing in the folder was written
    after it (``changed_since``, judged under the lock: a rebuild of the date that ended while
    gc ran is kept). The folder is renamed aside before it is deleted
    (``recs.files.remove_folder``), so a reader finds the whole snapshot or none; a removal cut
    short is finished by the next gc (``recs.files.sweep_removals``). Returns ``REMOVED``,
    ``NO_FOLDER``, ``BUSY`` or ``RECENT``; raises ``OSError`` for a lock or folder it cannot
    read or remove, or a symbolic link in the folder's place (gc reports it and goes on)."""
    target = Path(home) / "snapshots" / name
    lock = lock_file(target)
    if not lock.parent.is_dir():
        return NO_FOLDER
    _check_removable(target)
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return BUSY
        if not still_at(handle, lock):
            return NO_FOLDER  # another remover took it away meanwhile
        found = target.is_dir()
        if found and unchanged_since is not None and changed_since(target, unchanged_since):
            return RECENT
        if found:
            remove_folder(target)
        lock.unlink()  # still held: a freeze waiting on it retries on a new file
    return REMOVED if found else NO_FOLDER


def busy(home: Path, name: str) -> bool:
    """Whether a run holds the lock of ``snapshots/<name>/`` now (freezing or reading it), so
    ``remove`` would return ``BUSY``: ``recs gc --dry-run`` then does not list the date (a
    review's dry run listed a snapshot the real gc left). Asked without creating the lock file
    (``locks.held``). Raises ``OSError`` where ``remove`` would (``_check_removable``), and for
    a lock it may not read."""
    target = Path(home) / "snapshots" / name
    _check_removable(target)
    return held(lock_file(target))


def _check_removable(target: Path) -> None:
    """Raise ``OSError`` for what ``remove`` leaves of the retained folder ``target``: a symbolic
    link in its place (an operator's: gc removes no data it did not write), or a lock that
    exists and is not a regular file (a folder; a pipe, whose opening would wait for a writer:
    a review's gc hung on one)."""
    if target.is_symlink():
        raise OSError(f"{target} is a symbolic link: left, with what it points at")
    try:
        mode = lock_file(target).stat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file, as a lock file is", str(lock_file(target)))


def locked_dates(home: Path) -> list[str]:
    """The names ``N`` of the lock files ``snapshots/.N.lock`` (dates or not; sorted)."""
    root = Path(home) / "snapshots"
    if not root.is_dir():
        return []
    return sorted(p.name[1 : -len(".lock")] for p in root.glob(".*.lock") if p.is_file())


def lock_file(target: Path) -> Path:
    """``snapshots/.<date>.lock``: the lock of the retained folder ``target``
    (``retained._date_lock`` takes it to freeze the date, ``remove`` to remove it)."""
    return target.parent / f".{target.name}.lock"


def still_at(handle: Any, path: Path) -> bool:
    """Whether the open file ``handle`` is still the one at ``path`` (not deleted or replaced)."""
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(handle.fileno())
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)
