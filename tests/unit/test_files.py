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
