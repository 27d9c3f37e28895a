"""Which published version the whole server answers from, agreed by its worker processes.

Each worker process loads a new version on its own (``versions.VersionCache``), then says so;
the *served* pointer moves to that version only once every live worker holds it loaded, and
every request reads the pointer. So each response comes from one version, and reads are
monotonic across the server: once any worker has answered from a version, every later request
to any worker reads the same pointer (or a newer one) and has that version in memory. A
rollback of ``CURRENT`` moves the pointer back the same way: the one deliberate exception.

- ``LocalPointer``: one process (``recs serve --workers 1``, tests): the pointer moves as soon
  as this process holds the version.
- ``SharedPointer(state_dir)``: the workers of one ``recs serve`` (``RECS_API_STATE_DIR``, a
  fresh folder ``recs serve`` makes). ``served`` is a 4 KiB file every worker memory-maps:
  ``[seq u64][length u32][key as JSON]``; a request reads the 8-byte ``seq`` and decodes the
  key only when it changed (under a shared ``flock``). ``workers/<pid>.json`` lists the keys a
  worker holds; a writer (the worker whose watcher finds every live worker ready) holds an
  exclusive ``flock`` while it checks them and rewrites ``served``, ``seq`` last.

A worker that is still not ready ``straggler_seconds`` after the others is left behind: the
pointer moves (logged), and that worker loads the version on its next request.
"""

from __future__ import annotations

import fcntl
import json
import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from recs.files import process_running

log = logging.getLogger("recs.serving")

Key = tuple
"""A version's identity on disk: ``(run_id, manifest inode, manifest mtime_ns)``."""

_SIZE = 4096
_HEADER = struct.Struct("<QI")


class LocalPointer:
    """The served pointer of a single process."""

    def __init__(self) -> None:
        self._key: Key | None = None

    def served(self) -> Key | None:
        """The key every request answers from now (None: nothing served yet)."""
        return self._key

    def announce(self, keys: Iterable[Key]) -> None:
        """This process holds ``keys`` loaded (nothing to tell anyone)."""

    def advance(self, key: Key) -> bool:
        """Serve ``key`` (this process holds it); True if the pointer moved."""
        if self._key == key:
            return False
        self._key = key
        return True

    def close(self) -> None:
        """Nothing to release."""


class SharedPointer:
    """The served pointer shared by the worker processes of one server (module docstring).

    ``state_dir`` is created if missing; ``straggler_seconds`` bounds how long the others wait
    for a worker that does not load a version; ``pid`` is the worker's process id (default
    this process)."""

    def __init__(
        self, state_dir: Path, *, straggler_seconds: float = 120.0, pid: int | None = None
    ) -> None:
        self.state_dir = Path(state_dir)
        self.workers_dir = self.state_dir / "workers"
        self.workers_dir.mkdir(parents=True, exist_ok=True)
        self.straggler_seconds = straggler_seconds
        self.pid = os.getpid() if pid is None else pid  # another process's, in tests
        path = self.state_dir / "served"
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < _SIZE:
            os.ftruncate(self._fd, _SIZE)  # idempotent: every worker may do it
        self._map = mmap.mmap(self._fd, _SIZE)
        # flock is per open file: readers and the writer of this process need their own.
        self._write_fd = os.open(path, os.O_RDWR)
        self._read_lock = threading.Lock()
        self._cached: tuple[int, Key | None] = (-1, None)
        self._waiting_since: dict[Key, float] = {}

    def served(self) -> Key | None:
        """The key every request answers from now (None: nothing served yet)."""
        (seq,) = struct.unpack_from("<Q", self._map, 0)
        cached = self._cached
        if seq == cached[0]:
            return cached[1]
        with self._read_lock:
            fcntl.flock(self._fd, fcntl.LOCK_SH)
            try:
                seq, length = _HEADER.unpack_from(self._map, 0)
                payload = self._map[_HEADER.size : _HEADER.size + length]
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            key = tuple(json.loads(payload)) if length else None
            self._cached = (seq, key)
        return key

    def announce(self, keys: Iterable[Key]) -> None:
        """Record that this worker holds ``keys`` loaded (under the writers' lock, so no
        worker moves the pointer on an announcement this one has withdrawn)."""
        document = json.dumps({"pid": self.pid, "keys": sorted(list(k) for k in keys)})
        with self._exclusive():
            target = self.workers_dir / f"{self.pid}.json"
            tmp = self.workers_dir / f".{self.pid}.json.tmp"
            tmp.write_text(document, encoding="utf-8")
            os.replace(tmp, target)

    def advance(self, key: Key) -> bool:
        """Move the pointer to ``key`` if every live worker holds it (or the stragglers have
        had ``straggler_seconds``); True if it moved."""
        if self.served() == key:
            return False
        with self._exclusive():
            seq, length = _HEADER.unpack_from(self._map, 0)
            current = self._map[_HEADER.size : _HEADER.size + length]
            if length and tuple(json.loads(current)) == key:
                return False
            lagging = [pid for pid, keys in self._live_workers().items() if key not in keys]
            if lagging:
                since = self._waiting_since.setdefault(key, time.monotonic())
                if time.monotonic() - since < self.straggler_seconds:
                    return False
                log.warning(
                    "serving %s although worker(s) %s have not loaded it after %.0f s",
                    key[0], lagging, self.straggler_seconds,
                )  # fmt: skip
            payload = json.dumps(list(key)).encode()
            if _HEADER.size + len(payload) > _SIZE:
                raise ValueError(f"version key too long for the served pointer: {key!r}")
            self._map[_HEADER.size : _HEADER.size + len(payload)] = payload
            struct.pack_into("<I", self._map, 8, len(payload))
            struct.pack_into("<Q", self._map, 0, seq + 1)  # last: readers key on it
            self._waiting_since.pop(key, None)
            return True

    def close(self) -> None:
        """Withdraw this worker (its announcement file) and unmap."""
        try:
            (self.workers_dir / f"{self.pid}.json").unlink(missing_ok=True)
        except OSError:
            pass
        try:
            self._map.close()
        except BufferError:  # a reader still holds a view: the process is ending anyway
            pass
        for fd in (self._fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def _live_workers(self) -> dict[int, set[Key]]:
        """``{pid: keys}`` of every worker that announced and is still running (the files of
        dead ones are removed)."""
        found: dict[int, set[Key]] = {}
        for path in self.workers_dir.glob("*.json"):
            try:
                document = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            pid = int(document.get("pid", -1))
            if not process_running(pid):
                path.unlink(missing_ok=True)
                continue
            found[pid] = {tuple(key) for key in document.get("keys", [])}
        return found

    def _exclusive(self):
        return _Flock(self._write_fd)


class _Flock:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *_exc) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
