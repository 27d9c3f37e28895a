"""Test support: one user's published list read straight from a version's Parquet files.

The product's read path is ``recs.serving`` (batch list, read-time checks, cold start); this
plain reader lets tests compare a published version with what a run wrote.
"""

from __future__ import annotations

from pathlib import Path

from recs.errors import RunNotFoundError, UnknownUserError
from recs.published import current_or_raise, shard_file, version_manifest


def recommendations_for(published_dir: Path, user_id: int, version: str | None = None):
    """One user's published list, best first, from the current version (or ``version``).

    Reads only the user's shard file, ``shard_of(user_id, shard_count)`` with the version's
    own shard count, through a Polars scan whose ``user_id == ...`` filter is pushed down to
    the Parquet reader: row groups whose min/max statistics exclude the id are skipped, and
    since shard files are sorted by user_id one row group (or two) is read.

    Returns a ``polars.DataFrame`` with the contract's columns (``RECOMMENDATION_SCHEMA``:
    user_id, candidate_id, mutual_count, score, rank, followed_by, generated_at, run_id)
    sorted by rank; empty (same schema) if the user has no published list. Raises
    ``RunNotFoundError`` if nothing is published, the version is missing or its shard file
    is, and ``UnknownUserError`` for a negative id.
    """
    import polars as pl

    from recs.contracts import RECOMMENDATION_SCHEMA
    from recs.sharding import shard_of

    if user_id < 0:
        raise UnknownUserError(f"invalid user id {user_id}: user ids are non-negative integers")
    published_dir = Path(published_dir)
    name = version or current_or_raise(published_dir)
    manifest = version_manifest(published_dir, name)
    path = shard_file(published_dir, name, shard_of(user_id, int(manifest["shard_count"])))
    try:
        return (
            pl.scan_parquet(path)
            .filter(pl.col("user_id") == user_id)
            .select(list(RECOMMENDATION_SCHEMA))
            .sort("rank", "candidate_id")
            .collect()
        )
    except FileNotFoundError:
        raise RunNotFoundError(
            f"published version {name!r} is incomplete: missing {path}"
        ) from None
