"""``recs import edges --generate-missing``: the fields a bare edge list lacks, generated the way
``recs load-dataset`` generates them (``recs.demo.generated``, same generators and seed).

Generated, and listed in the summary (``generated``) by their ``GENERATED_FIELDS`` names:

- the accounts the edges name and the store lacks: every ``users`` field (an account's
  ``created_at`` is moved back to its earliest follow when the edges carry times);
- ``follow_edges.created_at``, when the source has no time column;
- pending follow requests (extra ``follow_edges`` rows), when ``follow_edges`` was empty and
  the source has no status column; blocks, mutes, dismissals and interest tags, each only when
  its table is empty.

Never overwritten: anything the source or the store holds. Unlike the rest of an import this
holds the distinct edges in memory (about 40 bytes an edge: the generators walk the whole
graph), as ``load-dataset`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import polars as pl

from recs.arrays import sorted_unique
from recs.contracts import TS
from recs.demo.follow_graph import EDGE_CHUNK_ROWS, FollowGraph
from recs.demo.generated import DATASET_SEED, GENERATED_FIELDS, GeneratedFields
from recs.imports.staging import Staging
from recs.imports.writers import StoreWriter

_EDGE_COLUMNS = ["follower_id", "followee_id", "created_at", "status"]
_GENERATED_TABLES = ("blocks", "mutes", "dismissed_candidates", "user_interests")
"""Tables filled with generated rows when empty (their ``GENERATED_FIELDS`` names)."""


def write_generated(
    writer: StoreWriter,
    staging: Staging,
    *,
    fresh: bool,
    users_fresh: bool,
    times_given: bool,
    status_given: bool,
    seed: int | None,
    default_time,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    """Load the staged edges plus what is generated for them (module docstring) through
    ``writer``; returns ``loaded, users_created, follow_counts, generated, seed`` and
    ``generated_rows`` (table -> rows)."""
    seed = DATASET_SEED if seed is None else seed
    edges = (
        pl.concat(list(staging.distinct_rows()), how="vertical")
        if staging.accepted_rows
        else pl.DataFrame(schema=staging.schema)
    )
    user_ids = sorted_unique(
        np.concatenate([edges["follower_id"].to_numpy(), edges["followee_id"].to_numpy()])
    )
    graph = FollowGraph.from_edges(
        user_ids, edges["follower_id"].to_numpy(), edges["followee_id"].to_numpy()
    )
    generated = GeneratedFields.for_graph(graph, seed)
    fields: list[str] = [name for name in GENERATED_FIELDS if name.startswith("users.")]
    rows: dict[str, int] = {}

    if not times_given:
        times = pl.concat([f.select("created_at") for f in generated.follow_frames()])
        edges = edges.with_columns(times["created_at"])
        fields.append("follow_edges.created_at")
    load = edges.select(["line_number", *_EDGE_COLUMNS])
    if fresh and not status_given:
        pending = generated.relationship_frame("pending_follows")
        load = pl.concat(
            [load, pending.select(pl.lit(None, pl.Int64).alias("line_number"), *_EDGE_COLUMNS)]
        ).sort("follower_id", "followee_id")
        fields.append("follow_edges (status='pending')")
        rows["pending_follows"] = pending.height

    def chunks(frame: pl.DataFrame) -> Iterator[pl.DataFrame]:
        for start in range(0, max(frame.height, 1), EDGE_CHUNK_ROWS):
            yield frame.slice(start, EDGE_CHUNK_ROWS)

    reverse_order = load.sort("followee_id", "follower_id")
    loaded = writer.load(
        _edges_spec(),
        chunks(load),
        fresh=fresh,
        reverse=lambda: chunks(reverse_order),
        progress=progress,
    )
    counts = None
    if fresh:
        counts = writer.set_follow_counts([_counts(load)], progress)
    users = generated.users_frame()
    if times_given:  # an account is never created after its first follow
        first = (
            pl.concat(
                [
                    edges.select(pl.col(side).alias("user_id"), "created_at")
                    for side in ("follower_id", "followee_id")
                ]
            )
            .group_by("user_id")
            .agg(pl.col("created_at").min().alias("first"))
        )
        users = (
            users.join(first, on="user_id", how="left")
            .with_columns(pl.min_horizontal("created_at", "first").cast(TS).alias("created_at"))
            .drop("first")
        )
    created = writer.create_users([users], fresh=users_fresh, progress=progress)
    for table in _GENERATED_TABLES:
        if not writer.is_empty(table):
            continue
        frame = (
            generated.interests_frame()
            if table == "user_interests"
            else generated.relationship_frame(table)
        )
        rows[table] = writer.add_rows(table, [frame], progress)
        fields.append(table)
    return {
        "loaded": loaded.inserted - rows.get("pending_follows", 0),
        "users_created": created,
        "follow_counts": counts,
        "generated": [name for name in GENERATED_FIELDS if name in fields],
        "generated_rows": rows,
        "seed": seed,
    }


def _edges_spec():
    from recs.imports.tables import IMPORT_TABLES

    return IMPORT_TABLES["edges"]


def _counts(edges: pl.DataFrame) -> pl.DataFrame:
    """``user_id, follower_count, following_count`` of the active follows, by ``user_id``."""
    active = edges.filter(pl.col("status") == "active")
    parts = [
        active.group_by(side).len(name).rename({side: "user_id"})
        for side, name in (("followee_id", "follower_count"), ("follower_id", "following_count"))
    ]
    return (
        parts[0]
        .join(parts[1], on="user_id", how="full", coalesce=True)
        .select(
            "user_id",
            pl.col("follower_count").fill_null(0).cast(pl.Int64),
            pl.col("following_count").fill_null(0).cast(pl.Int64),
        )
        .sort("user_id")
    )
