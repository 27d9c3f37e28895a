"""The version a run would replace, as the gate compares with it: counts over tonight's shards.

``replaced_version`` reads the version ``CURRENT`` names and counts its users with lists and its
rows in the shards a run computed, under the run's shard function: from the version's manifest
when the shard counts agree, otherwise from the ``user_id`` column of its files (re-sharded by
``recs.sharding.shard_expr``). Nothing to compare with (nothing published, a damaged version,
or no lists in those shards) is an answer too: ``None`` and the reason, which the gate records
as a skipped check rather than passing it silently -- except when a run store records that
``CURRENT`` names another version than this machine's ``published/`` does (or it has none):
that is a worker which does not see the served ``published/``, and the gate errors instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recs.errors import RunNotFoundError, ValidationEngineError
from recs.nightly.served import refuse_unseen
from recs.published import check_version, current_version, shard_file
from recs.sharding import shard_expr


@dataclass(frozen=True)
class ReplacedVersion:
    """Counts of the version a run would replace, restricted to the run's computed shards."""

    run_id: str
    users: int
    rows: int


def replaced_version(
    published_dir: Path, shard_count: int, shard_ids: list[int], run_id: str | None = None
) -> tuple[ReplacedVersion | None, str | None]:
    """``(counts, None)`` of the version ``CURRENT`` names over ``shard_ids`` (tonight's shard
    ids under ``shard_count``), or ``(None, reason)`` when there is nothing to compare with:
    nothing published, a missing or incomplete version, or no users with lists in those shards.
    Reads the manifest, and the versions's ``user_id`` columns only if its shard count differs.
    ``run_id``: the run the gate validates; if this machine's publish of it was killed after
    the run store recorded it (``served.unseen_current``'s ``finishing``), the gate compares
    with what ``CURRENT`` names here, the version that publish replaces.
    """
    published_dir = Path(published_dir)
    name = current_version(published_dir)
    # comparing with nothing, or another version, would decide the change checks wrongly
    refuse_unseen(published_dir, name, "validate_run", ValidationEngineError, finishing=run_id)
    if name is None:
        return None, "nothing is published yet: no version to compare with"
    try:
        manifest = check_version(published_dir, name)
    except RunNotFoundError as error:
        return None, f"CURRENT names a version that cannot be read ({error})"
    wanted = set(shard_ids)
    if int(manifest["shard_count"]) == shard_count:
        entries = [s for s in manifest["shards"] if s["shard_id"] in wanted]
        users = sum(int(s["users"]) for s in entries)
        rows = sum(int(s["rows"]) for s in entries)
    else:
        users, rows = _resharded_counts(published_dir, manifest, shard_count, wanted)
    if users == 0:
        return None, f"the version {name} has no users with lists in shards {sorted(wanted)}"
    return ReplacedVersion(run_id=name, users=users, rows=rows), None


def _resharded_counts(
    published_dir: Path, manifest: dict, shard_count: int, wanted: set[int]
) -> tuple[int, int]:
    """(users, rows) of a version whose shard count differs, counted under ``shard_count``."""
    import polars as pl

    files = [
        shard_file(published_dir, manifest["run_id"], int(s["shard_id"]))
        for s in manifest["shards"]
    ]
    counts = (
        pl.scan_parquet(files)
        .select("user_id")
        .filter(shard_expr("user_id", shard_count).is_in(sorted(wanted)))
        .select(pl.len().alias("rows"), pl.col("user_id").n_unique().alias("users"))
        .collect()
    )
    return int(counts["users"][0]), int(counts["rows"][0])
