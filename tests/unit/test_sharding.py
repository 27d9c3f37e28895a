"""The shard_id=N folder layout (recs.sharding.partition_files) and who may import it cheaply."""

from __future__ import annotations

import os
import subprocess
import sys

from recs.sharding import partition_files


def test_partition_files_reads_padded_and_plain_folders(tmp_path):
    for name in ("shard_id=007", "shard_id=12", "shard_id=x", "other"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "data_0.parquet").write_bytes(b"")
    found = partition_files(tmp_path)
    assert sorted(found) == [7, 12]
    assert found[7] == [tmp_path / "shard_id=007" / "data_0.parquet"]
    assert partition_files(tmp_path / "missing") == {}


def test_the_gate_lists_partitions_without_importing_the_traversal_or_its_compiler(tmp_path):
    # A gate task imports GX (seconds); it must not also import the traversal's compiled code
    # (numba: 0.9 s per task on the bench machine) just to list the run's partition folders.
    probe = (
        "import sys\n"
        "from recs.config import get_settings\n"
        "from recs.nightly import shard_gate, validation\n"
        "from recs.nightly.runs import RunPaths\n"
        f"paths = RunPaths.create({str(tmp_path)!r}, '2026-11-01', 'probe')\n"
        "shard_gate.inputs_fingerprint(paths, get_settings(), 0)\n"
        "validation.eligible_counts(paths.exports_dir)\n"
        "print(sorted(m for m in sys.modules if m == 'numba' or m.startswith('recs.traversal')))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "RECS_HOME": str(tmp_path)},
    ).stdout.strip()
    assert found == "[]"
