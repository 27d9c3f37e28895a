"""What the gate reads: a run's planned shard outputs and manifests, and tonight's eligible users.

``read_shard_outputs`` reads every planned ``shards/shard_id=NNN/`` (NNN below ``shard_count``):
a shard is *computed* if its manifest and its output are there (the traversal writes the manifest
last), else *failed*; each computed file's bytes are read once, so the sha256 the summary keeps
is of the bytes validated. ``eligible_users`` reads the dbt export; ``missing_upstream`` names an
earlier stage whose files are missing. No expectations here: ``recs.nightly.validation``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from recs.contracts import RECOMMENDATION_SCHEMA
from recs.nightly.runs import RunPaths
from recs.sharding import shard_expr

log = logging.getLogger("recs.nightly.validation")

# What a run must hold before the gate can judge it (written by build_models and build_graph).
UPSTREAM_FILES = {
    "build_models": ("exports/candidate_profiles.parquet", "exports/popularity_index.parquet"),
    "build_graph": ("graph/meta.json",),
}


def missing_upstream(paths: RunPaths) -> str | None:
    """What the gate needs from the stages before the traversal and does not find (one line
    naming the stage and the file), or None. The snapshot itself is checked by reading the
    run's settings before the gate starts."""
    for stage, names in UPSTREAM_FILES.items():
        for name in names:
            if not (paths.run_dir / name).is_file():
                return f"{stage} has not written {paths.run_dir / name}"
    return None


def eligible_users(exports_dir: Path, shard_ids: list[int] | None = None) -> pl.DataFrame:
    """Tonight's eligible users (of the shards ``shard_ids`` only, if given), one row per
    ``user_id`` (Int64), from ``eligible_users/shard_id=N/*.parquet`` (a shard without eligible
    users has no folder; an empty or absent export is an empty frame)."""
    root = Path(exports_dir) / "eligible_users"
    if shard_ids is None:
        files = sorted(root.glob("shard_id=*/*.parquet"))
    else:
        folders = [root / f"shard_id={shard_id}" for shard_id in sorted(set(shard_ids))]
        files = sorted(f for folder in folders for f in folder.glob("*.parquet"))
    if not files:
        return pl.DataFrame(schema={"user_id": pl.Int64})
    return (
        pl.scan_parquet(files, hive_partitioning=False)
        .select(pl.col("user_id").cast(pl.Int64))
        .unique()
        .sort("user_id")
        .collect()
    )


@dataclass
class ShardOutputs:
    """What the gate read from a run's planned shards.

    ``computed`` / ``failed``: the planned shard ids with and without (manifest and output).
    ``union``: every readable computed shard file concatenated (``how="diagonal_relaxed"``),
    columns as written, plus ``shard_id`` (Int32). ``shards``: one row per computed shard (see
    ``read_shard_outputs``). ``fingerprints``: ``[{"shard_id", "sha256", "rows", "users"}]`` of
    the readable files. ``statuses``: one ``{"shard_id", "status", "sha256", "rows", "users"}``
    per planned shard, ``status`` ``computed`` or ``failed`` (null figures when failed).
    """

    union: pl.DataFrame
    shards: pl.DataFrame
    fingerprints: list[dict[str, Any]]
    computed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)

    @property
    def statuses(self) -> list[dict[str, Any]]:
        printed = {item["shard_id"]: item for item in self.fingerprints}
        statuses = []
        for shard_id in sorted(self.computed + self.failed):
            found = printed.get(shard_id, {})
            statuses.append(
                {
                    "shard_id": shard_id,
                    "status": "computed" if shard_id in self.computed else "failed",
                    "sha256": found.get("sha256"),
                    "rows": found.get("rows"),
                    "users": found.get("users"),
                }
            )
        return statuses


def read_shard_outputs(
    paths: RunPaths, shard_count: int, shard_ids: list[int] | None = None
) -> ShardOutputs:
    """Read the planned shards ``0 .. shard_count-1`` of the run, or those of ``shard_ids`` only
    (no expectations yet).

    Any other ``shard_id=*`` folder (left by a plan with more shards) is ignored and logged.
    The ``shards`` frame, one row per computed shard, by shard_id: ``shard_id`` Int64,
    ``readable`` / ``schema_matches`` / ``is_sorted`` / ``manifest_readable`` Boolean (null
    when there is no file to judge), ``file_rows`` / ``file_users`` Int64,
    ``manifest_shard_id`` / ``manifest_rows`` / ``manifest_users`` Int64 (null when absent).
    The file's bytes are read once: the sha256 saved in the summary is of the bytes validated.
    """
    records: list[dict[str, Any]] = []
    frames: list[pl.DataFrame] = []
    fingerprints: list[dict[str, Any]] = []
    computed: list[int] = []
    failed: list[int] = []
    if shard_ids is None:
        warn_unplanned(paths, shard_count)
    for shard_id in range(shard_count) if shard_ids is None else shard_ids:
        output = paths.shard_output(shard_id)
        manifest_path = paths.shard_manifest(shard_id)
        if not (output.is_file() and manifest_path.is_file()):
            failed.append(shard_id)
            continue
        computed.append(shard_id)
        record: dict[str, Any] = {
            "shard_id": shard_id,
            "readable": False,
            "schema_matches": None,
            "is_sorted": None,
            "file_rows": None,
            "file_users": None,
        }
        content = output.read_bytes()
        try:
            frame = pl.read_parquet(io.BytesIO(content))
        except Exception:  # noqa: BLE001 - any unreadable file is a failed check, not a crash
            pass
        else:
            users = frame.get_column("user_id").n_unique() if "user_id" in frame.columns else 0
            record.update(
                readable=True,
                schema_matches=dict(frame.schema) == dict(RECOMMENDATION_SCHEMA)
                and frame.columns == list(RECOMMENDATION_SCHEMA),
                is_sorted=is_sorted_by_user_rank(frame),
                file_rows=frame.height,
                file_users=users,
            )
            frames.append(frame.with_columns(pl.lit(shard_id, pl.Int32).alias("shard_id")))
            fingerprints.append(
                {
                    "shard_id": shard_id,
                    "sha256": hashlib.sha256(content).hexdigest(),
                    "rows": frame.height,
                    "users": users,
                }
            )
        manifest = read_manifest(manifest_path)
        figures = {
            "manifest_shard_id": as_int(manifest.get("shard_id")),
            "manifest_rows": as_int(manifest.get("rows")),
            "manifest_users": as_int(manifest.get("users_with_recommendations")),
        }
        record.update(figures, manifest_readable=None not in figures.values())
        records.append(record)

    shards = pl.DataFrame(
        records,
        schema={
            "shard_id": pl.Int64,
            "readable": pl.Boolean,
            "schema_matches": pl.Boolean,
            "is_sorted": pl.Boolean,
            "file_rows": pl.Int64,
            "file_users": pl.Int64,
            "manifest_shard_id": pl.Int64,
            "manifest_rows": pl.Int64,
            "manifest_users": pl.Int64,
            "manifest_readable": pl.Boolean,
        },
    ).sort("shard_id")
    if frames:
        union = pl.concat(frames, how="diagonal_relaxed")
    else:
        union = pl.DataFrame(schema={**RECOMMENDATION_SCHEMA, "shard_id": pl.Int32})
    return ShardOutputs(
        union=union, shards=shards, fingerprints=fingerprints, computed=computed, failed=failed
    )


def warn_unplanned(paths: RunPaths, shard_count: int) -> list[str]:
    """Log (and return) the ``shard_id=*`` folders outside the plan ``0 .. shard_count-1``
    (left by a plan with more shards): the gate ignores them."""
    planned = {paths.shard_dir(shard_id).name for shard_id in range(shard_count)}
    ignored = sorted(p.name for p in paths.shards_dir.glob("shard_id=*") if p.name not in planned)
    if ignored:
        log.warning("validate %s: ignoring unplanned shard folders %s", paths.run_id, ignored)
    return ignored


def is_sorted_by_user_rank(frame: pl.DataFrame) -> bool | None:
    """True if rows are in strictly increasing (user_id, rank) order; None if a key is missing."""
    if not {"user_id", "rank"} <= set(frame.columns):
        return None
    if frame.height < 2:
        return True
    user_step = pl.col("user_id").diff()
    rank_step = pl.col("rank").cast(pl.Int64).diff()
    ordered = (user_step > 0) | ((user_step == 0) & (rank_step > 0))
    return bool(frame.select(ordered.slice(1).fill_null(False).all()).item())


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def eligible_in_shards(
    eligible: pl.DataFrame | None, shard_ids: list[int], outputs: ShardOutputs | None
) -> int | None:
    """How many of ``eligible``'s users fall in ``shard_ids`` (None before they were read)."""
    if eligible is None or outputs is None:
        return None
    shard_count = len(outputs.computed) + len(outputs.failed)
    return int(
        eligible.select(
            shard_expr("user_id", shard_count).is_in(pl.Series(shard_ids, dtype=pl.Int32).implode())
        )
        .to_series()
        .sum()
    )


def max_generated_at(union: pl.DataFrame) -> str | None:
    """Latest ``generated_at`` of the run's rows (ISO, naive UTC), None if there are none."""
    if "generated_at" not in union.columns or union.height == 0:
        return None
    latest = union.get_column("generated_at").max()
    return latest.isoformat() if latest is not None else None
