"""The version a run would replace, as the gate compares with it: counts over tonight's shards.

``replaced_version`` reads the version ``CURRENT`` names and counts its users with lists and its
rows in the shards a run computed, under the run's shard function: from the version's manifest
when the shard counts agree, otherwise from the ``user_id`` column of its files (re-sharded by
``recs.sharding.shard_expr``). Nothing to compare with (nothing published, a damaged version,
or no lists in those shards) is an answer too: ``None`` and the reason, which the gate records
as a skipped check rather than passing it silently -- except when a run store records that
``CURRENT`` names another version than this machine's ``published/`` does (or it has none):
that is a worker which does not see the served ``published/``, and the gate errors instead.
``change`` is the change checks' figure against it; ``change_text`` what a failed one's error
line says, with the next step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recs.config import Settings
from recs.errors import RunNotFoundError, ValidationEngineError
from recs.nightly.runs import RunPaths
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


def change(tonight: int, before: int) -> float:
    """The change checks' figure: ``tonight / before - 1`` (-0.25 is a 25 % drop)."""
    return tonight / before - 1.0


def change_text(
    paths: RunPaths,
    summary: dict[str, Any],
    replaced: ReplacedVersion,
    settings: Settings,
    *,
    others_failed: bool = False,
) -> str:
    """What a failed change check saw, for the gate's error line (a newcomer had to open
    ``results.json`` to learn the drop was -40.6 % against -25 %): ``; users with lists
    25,395 against 42,759 in night_1 (-40.6 %), ...; allowed -25 % to +300 % (this run's
    gate_max_drop / gate_max_growth, frozen with its snapshot)``, then the next step
    (``_change_remedy``) unless ``others_failed`` (checks beside the change checks failed: a
    new bound alone would not pass, a review ran it). ``summary``: the run's ``users`` and
    ``rows``."""
    figures, changes = [], []
    for label, tonight, before in (
        ("users with lists", summary["users"], replaced.users),
        ("rows", summary["rows"], replaced.rows),
    ):
        if before:
            changes.append(change(tonight, before))
        shown = f"{changes[-1] * 100:+.1f} %" if before else "n/a"
        figures.append(f"{label} {tonight:,} against {before:,} in {replaced.run_id} "
                       f"({shown})")  # fmt: skip
    return (
        f"; {', '.join(figures)}; allowed {-settings.gate_max_drop * 100:+.0f} % to "
        f"{settings.gate_max_growth * 100:+.0f} % (this run's gate_max_drop / gate_max_growth, "
        "frozen with its snapshot)"
        f"{'' if others_failed else _change_remedy(paths, changes, settings)}"
    )


def _change_remedy(paths: RunPaths, changes: list[float], settings: Settings) -> str:
    """The next step after a failed change check (a newcomer's run had none): a real change
    passes with the run made again under bounds that allow it, the smallest whole percent
    beyond the change seen (``; if the change is real, run it again with bounds that allow it:
    `RECS_GATE_MAX_DROP=0.61 recs run --snapshot-date ... --run-id ...` ...``); lost rows are
    restored in the store, then the date's snapshot is made again. ``changes``: the figures
    ``change_text`` computed. Empty if no change is out of bounds."""
    allow = []
    drop = max([-c for c in changes if c < -settings.gate_max_drop], default=None)
    if drop is not None:  # at most the setting's own bound: a drop of 100 % is 1.00
        allow.append(f"RECS_GATE_MAX_DROP={min(math.floor(drop * 100 + 1) / 100, 1.0):.2f}")
    growth = max([c for c in changes if c > settings.gate_max_growth], default=None)
    if growth is not None:
        allow.append(f"RECS_GATE_MAX_GROWTH={math.floor(growth * 100 + 1) / 100:.2f}")
    if not allow:
        return ""
    return (
        f"; if the change is real, run it again with bounds that allow it: `{' '.join(allow)} "
        f"recs run --snapshot-date {paths.snapshot_date.isoformat()} --run-id {paths.run_id}` "
        "(the bounds are frozen when the run is made; it reuses the date's retained snapshot, "
        "which holds the graph as it was frozen); if the live store lost rows by mistake, "
        "restore them, then add --rebuild-snapshot"
    )
