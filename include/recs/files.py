"""Files a run or a publish writes: atomically and durably, JSON documents, checksums.

One home for these rules (light: standard library only):

- **Atomic, durable writes** (``atomic_write``, ``atomic_path``): the bytes go to a hidden
  temporary sibling unique to the attempt (``staging_name``), are fsynced, and replace the
  target with ``os.replace``, which is atomic on POSIX: a reader sees the old file or the new
  one, never half of one, and after a crash never a renamed file whose data did not reach the
  disk. ``sync_folder`` also fsyncs the folder, so the rename itself survives a power cut (the
  ``CURRENT`` pointer).
- **JSON documents** next to run outputs (manifests, summaries): ``write_json`` (indented,
  key-sorted, atomic) and ``read_json``.
- **Hard links** of a finished file into another folder (``link_or_copy``).
- **Folder removal** as one step for readers (``remove_folder``: renamed aside, then deleted;
  ``sweep_removals`` ends one cut short).
- **Checksums**: ``sha256_file`` (hex).
- **Parquet read back** (``read_parquet``): a file cut short or overwritten is one
  ``CorruptFileError`` naming it, not the reader's traceback (Polars, imported when called).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from recs.errors import CorruptFileError, RunNotFoundError

HASH_CHUNK_BYTES = 1 << 20


def staging_name(name: str, suffix: str) -> str:
    """A hidden sibling name for one attempt's temporary output: ``.<name>.<pid>-<random><suffix>``,
    unique per process and attempt, so two attempts (a retry overlapping a stuck one) never
    write into the same temporary file or folder."""
    return f".{name}.{os.getpid()}-{secrets.token_hex(4)}{suffix}"


REMOVING = ".gc"
"""The suffix of a folder ``remove_folder`` renamed aside and is deleting."""
_REMOVING_NAME = re.compile(r"\..+\.(?P<pid>\d+)-[0-9a-f]{8}" + re.escape(REMOVING))
"""``staging_name(name, REMOVING)``: only such names are swept, never a folder of one's own."""


def remove_folder(path: Path) -> None:
    """Delete the folder ``path`` as one step for its readers: renamed aside first
    (``staging_name(name, REMOVING)``), then deleted, so nothing finds half of it under its name,
    and a deletion cut short leaves a hidden leftover ``sweep_removals`` ends (not a half folder
    whose own time, moved by the deletions, would look recent). What vanishes meanwhile (another
    process sweeping the same leftover) is taken as deleted. Raises ``OSError``."""
    aside = path.with_name(staging_name(path.name, REMOVING))
    os.rename(path, aside)
    shutil.rmtree(aside, onerror=_gone_is_deleted)


def sweep_removals(parent: Path) -> list[str]:
    """Delete what ``remove_folder`` calls cut short left directly in ``parent``: hidden folders
    named as it names them whose process is no longer running on this machine (one still
    deleting is left to it; links and other names are never touched). On a folder several
    machines or containers share, "running" is judged by this one's processes: one another
    machine is still deleting may be swept with it (harmless: ``remove_folder`` takes what
    vanishes as deleted), and a leftover whose pid a process here has since taken waits for it
    to end. They are read by nothing, so no lock is needed. Returns their names, sorted (none
    when ``parent`` is missing). Raises ``OSError`` for one it cannot delete."""
    if not parent.is_dir():
        return []
    leftovers = []
    for path in sorted(parent.glob(f".*{REMOVING}")):
        found = _REMOVING_NAME.fullmatch(path.name)
        pid = int(found["pid"]) if found else 0
        # this process deletes none now: its own removal was cut short (an error, then gc again)
        running = pid != os.getpid() and process_running(pid)
        if found and path.is_dir() and not path.is_symlink() and not running:
            shutil.rmtree(path, onerror=_gone_is_deleted)
            leftovers.append(path.name)
    return leftovers


def process_running(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (``kill(pid, 0)``; another user's
    counts): the one that named a staging file (``staging_name`` holds its pid), or a server
    worker (``recs.serving.coordination``)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False  # not a pid at all
    return True


def _gone_is_deleted(function: Any, path: str, exc_info: Any) -> None:
    """``shutil.rmtree``'s error handler: an entry already gone is deleted; others raise."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename or a new file in it) to disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush a file written by someone else (a copy, a library writer) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(
    path: Path, *, sync_folder: bool = False, durable: bool = True
) -> Iterator[Path]:
    """A temporary path to write ``path`` through, for writers that take a path (Polars,
    PyArrow): on a clean exit the file there is fsynced and replaces ``path``; on an error it
    is removed and ``path`` is left as it was. ``durable=False`` skips the fsync (still
    atomic): for scratch files whose reader checks them by a size recorded in a durable
    document written after them (the graph's pieces)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(staging_name(path.name, ".tmp"))
    try:
        yield tmp
        if durable:
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_folder:
        fsync_dir(path.parent)


@contextmanager
def atomic_write(
    path: Path, *, binary: bool = False, sync_folder: bool = False, durable: bool = True
) -> Iterator[IO]:
    """An open file (text UTF-8, or ``binary``) whose contents replace ``path`` atomically and
    durably on a clean exit (module docstring; ``durable``: ``atomic_path``); on an error
    ``path`` is left as it was."""
    with atomic_path(path, sync_folder=sync_folder, durable=durable) as tmp:
        with tmp.open("wb" if binary else "w", encoding=None if binary else "utf-8") as handle:
            yield handle


def link_or_copy(source: Path, target: Path, *, sync: bool = False) -> None:
    """Hard-link ``source`` to ``target`` (the same bytes under two names, no copy); copy when
    linking is impossible (another filesystem, or one without hard links). ``sync`` fsyncs the
    data. A file linked this way must never be rewritten in place, only replaced. Raises
    ``RunNotFoundError`` if ``source`` is missing."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except FileNotFoundError:
        raise RunNotFoundError(f"missing {source}") from None
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        shutil.copyfile(source, target)
    if sync:
        fsync_file(target)


def write_json(path: Path, document: Any) -> Path:
    """Write ``document`` as indented, key-sorted JSON (``default=str``), atomically."""
    with atomic_write(path) as handle:
        json.dump(document, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
    return Path(path)


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object (every state file of a run or version is one). Raises
    ``RunNotFoundError`` naming a missing file, ``CorruptFileError`` (one line, with the
    parser's reason) for one that is truncated, not JSON or not an object."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunNotFoundError(f"missing {path}") from None
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise CorruptFileError(
            f"{path} is damaged: not readable JSON ({str(error).splitlines()[0][:120]})"
        ) from None
    if not isinstance(document, dict):
        raise CorruptFileError(
            f"{path} is damaged: a JSON {type(document).__name__}, not an object"
        )
    return document


def sha256_file(path: Path) -> str:
    """The sha256 (hex) of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(HASH_CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


RERUN_STAGE = "rerun the stage that wrote it"
"""The remedy ``read_parquet`` gives; ``recs.nightly.runs.naming_the_stage`` names the stage."""


def read_parquet(path: Path, columns: list[str] | None = None):
    """``polars.read_parquet(path, columns=columns)``; a file Polars cannot read (cut short,
    overwritten, a column missing) raises ``CorruptFileError`` with the path and Polars' first
    line, a missing one ``RunNotFoundError``."""
    import polars as pl

    path = Path(path)
    try:
        return pl.read_parquet(path, columns=columns)
    except FileNotFoundError:
        raise RunNotFoundError(f"missing file {path}") from None
    except (pl.exceptions.PolarsError, OSError) as error:
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise CorruptFileError(
            f"{path} is unreadable as Parquet ({reason}): {RERUN_STAGE}", path
        ) from None
