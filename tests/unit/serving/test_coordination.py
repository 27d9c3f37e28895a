"""The served-version pointer shared by the worker processes of one server.

Two ``SharedPointer`` objects over one folder stand for two workers; the second one's pid is a
real child process (``sleep``), so killing it makes that worker dead for the liveness check.
Keys are ``(run_id, inode, mtime_ns)`` tuples as ``versions._version_key`` makes them.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from recs.serving.coordination import LocalPointer, SharedPointer

OLD = ("night_1", 11, 111)
NEW = ("night_2", 22, 222)


@pytest.fixture
def other_worker():
    child = subprocess.Popen(["sleep", "60"])
    yield child
    child.kill()
    child.wait()


def test_local_pointer_moves_at_once():
    pointer = LocalPointer()
    assert pointer.served() is None
    assert pointer.advance(OLD) is True
    assert pointer.advance(OLD) is False
    assert pointer.served() == OLD


def test_shared_pointer_waits_for_every_live_worker(tmp_path, other_worker):
    """Worker A holds NEW, worker B only OLD: A cannot move the pointer; once B holds NEW too,
    it moves, and B's reads see it without being told."""
    first = SharedPointer(tmp_path)
    second = SharedPointer(tmp_path, pid=other_worker.pid)
    first.announce({OLD})
    second.announce({OLD})
    assert first.advance(OLD) is True
    assert second.served() == OLD
    first.announce({OLD, NEW})
    assert first.advance(NEW) is False
    assert first.served() == OLD and second.served() == OLD
    second.announce({OLD, NEW})
    assert first.advance(NEW) is True
    assert second.served() == NEW  # the other worker's view, from the shared file
    assert first.advance(NEW) is False
    first.close()
    second.close()


def test_a_dead_worker_does_not_hold_the_switch(tmp_path, other_worker):
    """B announced only OLD and then died: its announcement is ignored (and removed)."""
    first = SharedPointer(tmp_path)
    second = SharedPointer(tmp_path, pid=other_worker.pid)
    first.announce({OLD, NEW})
    second.announce({OLD})
    assert first.advance(NEW) is False
    other_worker.kill()
    other_worker.wait()
    assert first.advance(NEW) is True
    assert not (tmp_path / "workers" / f"{other_worker.pid}.json").exists()
    first.close()
    second.close()


def test_a_straggler_is_left_behind_after_the_timeout(tmp_path, other_worker):
    """B never loads NEW: after straggler_seconds (0.2 s here) A moves the pointer anyway."""
    first = SharedPointer(tmp_path, straggler_seconds=0.2)
    second = SharedPointer(tmp_path, pid=other_worker.pid)
    first.announce({NEW})
    second.announce(set())
    assert first.advance(NEW) is False
    time.sleep(0.25)
    assert first.advance(NEW) is True
    assert second.served() == NEW
    first.close()
    second.close()


def test_a_rollback_moves_the_pointer_back(tmp_path):
    """CURRENT back to an older version: the pointer follows (the deliberate exception)."""
    pointer = SharedPointer(tmp_path)
    pointer.announce({OLD, NEW})
    assert pointer.advance(NEW) is True
    assert pointer.advance(OLD) is True
    assert pointer.served() == OLD
    pointer.close()


def test_a_closed_worker_withdraws(tmp_path):
    pointer = SharedPointer(tmp_path)
    pointer.announce({OLD})
    assert (tmp_path / "workers" / f"{pointer.pid}.json").exists()
    pointer.close()
    assert not (tmp_path / "workers" / f"{pointer.pid}.json").exists()
