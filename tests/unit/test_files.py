"""recs.files: atomic, durable writes leave the old file or the new one, never half of one."""

from __future__ import annotations

import hashlib

import pytest

from recs.errors import RunNotFoundError
from recs.files import atomic_path, atomic_write, read_json, sha256_file, write_json


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "deep" / "CURRENT"
    with atomic_write(target, sync_folder=True) as handle:
        handle.write("night_1\n")
    with atomic_write(target) as handle:
        handle.write("night_2\n")
    assert target.read_text() == "night_2\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["CURRENT"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "manifest.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(target) as handle:
        handle.write("half of a new")
        raise RuntimeError("writer died")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_atomic_path_serves_writers_that_take_a_path(tmp_path):
    target = tmp_path / "part.bin"
    with atomic_path(target) as tmp:
        assert tmp != target and tmp.parent == target.parent
        tmp.write_bytes(b"\x00\x01")
        assert not target.exists()  # invisible until the block ends
    assert target.read_bytes() == b"\x00\x01"


def test_json_documents_round_trip_sorted_and_a_missing_one_names_its_path(tmp_path):
    path = write_json(tmp_path / "summary.json", {"b": 1, "a": [1, 2]})
    assert path.read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    assert read_json(path) == {"a": [1, 2], "b": 1}
    with pytest.raises(RunNotFoundError, match="missing .*nope.json"):
        read_json(tmp_path / "nope.json")


def test_sha256_file_is_the_digest_of_the_bytes(tmp_path):
    """3 MiB + 1 byte: more than one read block."""
    data = bytes(range(256)) * (3 * 4096) + b"x"
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_sweep_removals_ends_only_removals_whose_process_has_ended(tmp_path):
    """(From a review.) Under one folder: a leftover of an ended process (swept), one of a
    process still running (left: it may be deleting it now, and a second gc removed it under
    the first, which died of FileNotFoundError), a user's own `.backup.gc` and `.x.gc` folders
    (left: not named as ``remove_folder`` names them), and a link in a leftover's shape (left)."""
    import subprocess
    import sys

    from recs.files import sweep_removals

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            "ended": f".night_1.{ended.stdout.strip()}-0123abcd.gc",
            "running": f".night_2.{alive.pid}-89abcdef.gc",
            "own": ".backup.gc",
            "short": ".x.gc",
        }
        for name in names.values():
            (tmp_path / name / "part").mkdir(parents=True)
            (tmp_path / name / "part" / "data").write_text("rows")
        (tmp_path / ".night_3.1-00000000.gc").symlink_to(tmp_path / names["own"])
        assert sweep_removals(tmp_path) == [names["ended"]]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [names["running"], names["own"], names["short"], ".night_3.1-00000000.gc"]
        )
        assert (tmp_path / names["own"] / "part" / "data").read_text() == "rows"
    finally:
        alive.kill()
        alive.wait()
    assert sweep_removals(tmp_path) == [names["running"]]  # its process has ended now
    assert sweep_removals(tmp_path / "missing") == []


def test_remove_folder_takes_what_vanishes_meanwhile_as_deleted(tmp_path, monkeypatch):
    """Another process deletes a file just before ``remove_folder`` does (a concurrent sweep):
    the unlink's FileNotFoundError means deleted, and the rest goes; any other error raises,
    and leaves the folder aside under its hidden name (the next sweep's)."""
    import os

    from recs.files import remove_folder

    for part in ("a", "b"):
        (tmp_path / "run" / part).mkdir(parents=True)
        (tmp_path / "run" / part / "rows").write_text("x")
    unlink = os.unlink
    failures = []

    def deleted_by_another(path, *args, **kwargs):
        unlink(path, *args, **kwargs)
        if not failures:
            failures.append(path)
            raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(os, "unlink", deleted_by_another)
    remove_folder(tmp_path / "run")
    assert failures and list(tmp_path.iterdir()) == []

    def refused(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    (tmp_path / "kept" / "a").mkdir(parents=True)
    (tmp_path / "kept" / "a" / "rows").write_text("x")
    monkeypatch.setattr(os, "unlink", refused)
    with pytest.raises(PermissionError):
        remove_folder(tmp_path / "kept")
    monkeypatch.setattr(os, "unlink", unlink)
    [aside] = tmp_path.iterdir()
    assert aside.name.startswith(".kept.") and (aside / "a" / "rows").is_file()
