"""A marker's file entries (``artifacts``): what a part's files are, and whether a file is one.

An entry is ``{"size", "sha256", "mtime_ns"}`` of one file, by its path relative to the run
folder; a part's ``checksum`` is the sha256 of its paths and digests. Every writer replaces its
files whole, so a file with an entry's size and mtime is that entry's file (``same_file``): a
``stat``, nothing read. ``graph_cache`` keeps such entries for its copies too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from recs.files import sha256_file
from recs.nightly.parts import Part


def local_files(run_dir: Path, part: Part) -> dict[str, Path]:
    """The part's files in the local run folder, by relative path (posix), sorted."""
    found: dict[str, Path] = {}
    for root in part.roots:
        start = Path(run_dir) / root
        candidates = [start] if start.is_file() else sorted(start.rglob("*"))
        for path in candidates:
            relative = path.relative_to(run_dir).as_posix()
            if path.is_file() and part.covers(relative):
                found[relative] = path
    return dict(sorted(found.items()))


def file_entry(path: Path, *, mtime: bool = True, checksum: bool = True) -> dict[str, Any]:
    """A marker's entry of one file: ``{"size"[, "sha256"][, "mtime_ns"]}`` (without
    ``checksum``, a ``stat`` only: nothing is read)."""
    found = Path(path).stat()
    entry: dict[str, Any] = {"size": found.st_size}
    if checksum:
        entry["sha256"] = sha256_file(path)
    if mtime:
        entry["mtime_ns"] = found.st_mtime_ns
    return entry


def same_file(path: Path, entry: dict[str, Any]) -> bool:
    """Whether the local ``path`` is the file of the marker ``entry``: same size and mtime (ns;
    every writer replaces its files whole, and a pull gives them the writer's mtime)."""
    try:
        found = path.stat()
    except OSError:
        return False
    return found.st_size == entry["size"] and found.st_mtime_ns == entry["mtime_ns"]


def same_content(old: dict | None, new: dict) -> bool:
    return bool(old) and old["size"] == new["size"] and old["sha256"] == new["sha256"]


def content_checksum(entries: dict[str, dict]) -> str:
    """sha256 (hex) of a part's content: its relative paths and their sha256, sorted."""
    listing = json.dumps(sorted((r, e["sha256"]) for r, e in entries.items()))
    return hashlib.sha256(listing.encode()).hexdigest()
