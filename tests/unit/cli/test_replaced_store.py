"""Retained snapshots of a live store that is replaced are discarded, so no run reuses them.

A retained snapshot (``snapshots/<date>/``) is reused by every later run of its date; one left
from a store that ``load-dataset``/``generate-graph`` or ``import --replace`` replaced would
publish the old graph. An import that only adds rows keeps them and names their dates."""

from __future__ import annotations

import json
from pathlib import Path


def _retain(home: Path, day: str) -> Path:
    """A complete retained snapshot folder (its manifest is what makes it complete)."""
    folder = home / "snapshots" / day
    folder.mkdir(parents=True)
    (folder / "users.parquet").write_bytes(b"old store")
    (folder / "manifest.json").write_text("{}")
    return folder


def test_generate_graph_replace_discards_every_retained_snapshot(recs, tmp_path):
    home = tmp_path / "home"
    code, _, _ = recs("generate-graph", "--users", "40", "--seed", "3", "--avg-out-degree", "3")
    assert code == 0
    old = [_retain(home, "2026-10-31"), _retain(home, "2026-11-01")]
    partial = home / "snapshots" / ".2026-11-02.partial"  # a freeze in progress: not retained
    partial.mkdir()
    code, out, _ = recs("generate-graph", "--users", "40", "--seed", "4", "--avg-out-degree", "3",
                        "--replace", "--json")  # fmt: skip
    assert code == 0
    assert json.loads(out)["discarded_snapshots"] == ["2026-10-31", "2026-11-01"]
    assert not any(folder.exists() for folder in old)
    assert partial.is_dir()
    assert sorted(p.name for p in (home / "snapshots").iterdir() if not p.name.endswith(".lock")) \
        == [".2026-11-02.partial"]  # fmt: skip


def test_an_import_that_adds_rows_keeps_snapshots_and_names_them_replace_discards(recs, tmp_path):
    home = tmp_path / "home"
    first = tmp_path / "first.csv"
    first.write_text("follower_id,followee_id\n1,2\n2,3\n")
    code, out, _ = recs("import", "edges", str(first), "--json")
    assert code == 0 and json.loads(out)["discarded_snapshots"] == []
    kept = _retain(home, "2026-11-01")
    more = tmp_path / "more.csv"
    more.write_text("follower_id,followee_id\n3,1\n")
    code, out, err = recs("import", "edges", str(more))
    assert code == 0 and kept.is_dir()
    assert any("retained snapshots do not hold this import: 2026-11-01" in line for line in err)
    code, out, _ = recs("import", "edges", str(more), "--replace", "--json")
    summary = json.loads(out)
    assert code == 0 and summary["discarded_snapshots"] == ["2026-11-01"]
    assert summary["snapshots_without_this_import"] == [] and not kept.exists()
