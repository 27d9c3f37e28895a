"""The run lock when its file is removed (``recs.nightly.locks._locked``): a run that never froze
its snapshot removes its folder, ``.lock`` with it, while holding the lock (``run_all``).

A process that opened the old ``.lock`` before it went must not hold the run on a file no other
process can see, and one whose folder went between its ``mkdir`` and ``open`` must not crash.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from recs.config import Settings
from recs.errors import CutOffAheadError, RunInProgressError
from recs.nightly import locks, pipeline, point_in_time
from recs.nightly.locks import run_lock
from recs.nightly.runs import RunPaths


def _held_elsewhere(path: Path) -> bool:
    """Whether a fresh open of ``path`` (another process's view) cannot take its lock."""
    descriptor = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False


def test_a_lock_file_removed_between_open_and_flock_is_not_trusted(tmp_path, monkeypatch):
    """The folder goes (and with it the file this process opened) just before the flock: the
    lock taken on the unlinked file is dropped and the file the path names now is locked."""
    path = tmp_path / "run" / ".lock"
    real_flock, removed = fcntl.flock, []

    def flock_after_removal(descriptor, operation):
        if not removed and operation & fcntl.LOCK_NB:
            removed.append(os.fstat(descriptor).st_ino)
            shutil.rmtree(tmp_path / "run")  # the holder's run_all removed its folder
        return real_flock(descriptor, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_removal)
    descriptor = locks._locked(path, False, "run r")
    monkeypatch.undo()
    try:
        assert removed and os.fstat(descriptor).st_ino == os.stat(path).st_ino
        assert _held_elsewhere(path)
    finally:
        os.close(descriptor)


RACED_LOCK = ("runs", "2026-11-01", "r", ".lock")


def _remove_folder_in_open(tmp_path, monkeypatch, failed: list) -> None:
    """``os.open`` of the lock file finds its folder just removed (once)."""
    path, real_open = tmp_path.joinpath(*RACED_LOCK), os.open

    def open_after_removal(name, flags, *args, **kwargs):
        if name == path and not failed:
            failed.append(name)
            shutil.rmtree(tmp_path / "runs" / "2026-11-01")  # another run removed the date
        return real_open(name, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_after_removal)


def _remove_folder_in_mkdir(tmp_path, monkeypatch, failed: list) -> None:
    """pathlib's ``mkdir`` raises ``FileExistsError`` (once), as when the folder went between
    its mkdir(2), EEXIST, and its ``is_dir`` check."""
    parent, real_mkdir = tmp_path.joinpath(*RACED_LOCK).parent, Path.mkdir

    def mkdir_racing(self, *args, **kwargs):
        if self == parent and not failed:
            failed.append(self)
            raise FileExistsError(17, "File exists", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir_racing)


@pytest.mark.parametrize("race", [_remove_folder_in_open, _remove_folder_in_mkdir])
def test_a_folder_removed_while_the_lock_is_taken_is_made_again(tmp_path, monkeypatch, race):
    """(From reviews: 8 of 3,200 concurrent attempts crashed with FileNotFoundError, between
    mkdir and open; with two real processes, pathlib's mkdir raised FileExistsError.)"""
    failed: list = []
    race(tmp_path, monkeypatch, failed)
    path = tmp_path.joinpath(*RACED_LOCK)
    descriptor = locks._locked(path, False, "run r")
    monkeypatch.undo()
    try:
        assert failed and _held_elsewhere(path)
    finally:
        os.close(descriptor)


@pytest.mark.parametrize("in_the_way", ["r", "2026-11-01"])
def test_a_file_where_a_run_folder_goes_is_one_error_not_a_retry(tmp_path, in_the_way):
    """(From a review: it was retried 100 times, then called a lock file "being removed".)"""
    from recs.errors import RecsError

    path = tmp_path.joinpath(*RACED_LOCK)
    blocking = path.parent if in_the_way == "r" else path.parent.parent
    blocking.parent.mkdir(parents=True)
    blocking.write_text("not a folder")
    with pytest.raises(RecsError, match=f"run r: {blocking} is a file, where a folder of the "
                       "run goes: move it") as raised:  # fmt: skip
        locks._locked(path, False, "run r")
    assert raised.value.exit_code == 2


def _wait(path: Path, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"timed out waiting for {path}"
        time.sleep(0.02)


def test_two_processes_never_hold_one_run_after_its_folder_went(tmp_path, monkeypatch):
    """(From a review, with real processes.) B opens ``<run>/.lock`` while run_all (A) holds
    it; A is refused (today is not over), removes its folder and lets go; B's flock then
    succeeds. B must hold the ``.lock`` the folder has now, so a third taker is refused."""
    today = dt.datetime.now(dt.UTC).date()
    home, signals = tmp_path / "home", tmp_path / "signals"
    signals.mkdir()
    child = textwrap.dedent(f"""
        import fcntl, time
        from pathlib import Path
        from recs.nightly import locks
        from recs.nightly.runs import RunPaths
        sig = Path({str(signals)!r})
        real = fcntl.flock
        def slow_flock(fd, op):  # the pause between os.open and flock
            if op & fcntl.LOCK_NB and not (sig / "opened").exists():
                (sig / "opened").touch()
                while not (sig / "go").exists():
                    time.sleep(0.02)
            return real(fd, op)
        fcntl.flock = slow_flock
        with locks.run_lock(RunPaths.create(Path({str(home)!r}), {today.isoformat()!r}, "same")):
            (sig / "holding").touch()
            while not (sig / "done").exists():
                time.sleep(0.02)
    """)
    started = []

    def refused_while_b_arrives(*args, **kwargs):  # run_all's first step under the lock
        started.append(subprocess.Popen([sys.executable, "-c", child]))
        _wait(signals / "opened")  # B has opened the .lock A holds
        return real_refusal(*args, **kwargs)

    real_refusal = point_in_time.refuse_cut_off_ahead
    monkeypatch.setattr(point_in_time, "refuse_cut_off_ahead", refused_while_b_arrives)
    try:
        with pytest.raises(CutOffAheadError):
            pipeline.run_all(home, today, "same", Settings(home=home))
        (signals / "go").touch()
        _wait(signals / "holding")
        with pytest.raises(RunInProgressError):
            with run_lock(RunPaths.create(home, today, "same")):
                pass
    finally:
        (signals / "done").touch()
        for process in started:
            process.wait(30)


@pytest.mark.parametrize("with_store", [False, True])
@pytest.mark.parametrize("shard_id", [4, -1])
def test_a_shard_the_run_lacks_is_refused_before_its_lock_file(
    tmp_path, monkeypatch, with_store, shard_id
):
    """``recs shard run --shard 4`` on a run of 4 shards (0..3), and -1: one line, and no
    ``.locks/shard_id=….lock`` left; with a run store too (a review found the lock file made
    there), where the manifest comes from the store to a machine that has not seen the run."""
    import json

    from recs.errors import ShardOutOfRangeError
    from recs.nightly import artifacts
    from recs.nightly.artifacts import SNAPSHOT, RunStore

    home = tmp_path / "home"
    settings = Settings(home=home, shard_count=4)
    paths = RunPaths.create(home, "2026-11-01", "r1")
    paths.snapshot_dir.mkdir(parents=True)
    paths.snapshot_manifest.write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    if with_store:
        store = RunStore((tmp_path / "store").as_uri())
        store.push(paths, SNAPSHOT)
        shutil.rmtree(home)  # a worker that has not seen the run
        monkeypatch.setattr(artifacts, "run_store", lambda: store)
    with pytest.raises(ShardOutOfRangeError, match=rf"shard {shard_id} is out of range"):
        pipeline.traverse_shard(paths, shard_id)
    assert not list(paths.run_dir.glob(".locks/*"))


def test_a_stage_starting_while_a_probe_holds_the_lock_waits_it_out(tmp_path):
    """(From a second review.) ``in_progress`` (gc, summary) takes a run's lock for an instant;
    a stage taking it in that instant was refused ("is in progress"). Here another process
    holds it for 20 ms, well within the retries (5 x 10 ms), and the stage gets it; held for
    good, the stage is still refused."""
    paths = RunPaths.create(tmp_path, "2026-11-01", "r1")
    paths.run_dir.mkdir(parents=True)
    hold = textwrap.dedent(
        """
        import fcntl, os, sys, time
        fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
        """
    )
    for seconds, refused in ((0.02, False), (30, True)):
        holder = subprocess.Popen(
            [sys.executable, "-c", hold, str(paths.run_dir / ".lock"), str(seconds)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert holder.stdout.readline().strip() == "held"
            if refused:
                with pytest.raises(RunInProgressError):
                    with run_lock(paths):
                        pass
            else:
                with run_lock(paths):
                    assert holder.wait(5) == 0  # it had let go: the stage holds the lock now
        finally:
            holder.kill()
            holder.wait()


def test_asking_whether_a_run_is_in_progress_needs_no_write_access(tmp_path, monkeypatch):
    """(From a second review.) A home mounted read-only (the API container's, in
    docker-compose): ``in_progress`` opens the lock file read-only, so `recs summary` there
    works (on 9d911c1 it failed: Read-only file system). A write open is refused here as such a
    mount refuses it."""
    import errno

    paths = RunPaths.create(tmp_path, "2026-11-01", "r1")
    paths.run_dir.mkdir(parents=True)
    (paths.run_dir / ".lock").touch()
    opening = os.open

    def read_only_mount(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return opening(path, flags, *args, **kwargs)

    monkeypatch.setattr(locks.os, "open", read_only_mount)
    assert locks.in_progress(paths.run_dir) is False
