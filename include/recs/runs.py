"""Run-scoped paths: everything a run writes lives under ``runs/<snapshot_date>/<run_id>/``.

Light module (standard library only), importable from DAG files. Nothing here reads the wall
clock: a run is identified by its snapshot date (the DAG run's logical date) and its run id.

Layout of one run (``RunPaths``)::

    runs/<snapshot_date>/<run_id>/
        snapshot/                       freeze_snapshot: Parquet copy of the live store
            users.parquet  blocks.parquet  mutes.parquet  dismissed_candidates.parquet
            user_interests.parquet
            follow_edges/shard_id=NNN/part-0.parquet   (by shard of follower_id)
            manifest.json
        warehouse.duckdb                build_models: the run's one DuckDB file (one writer)
        exports/                        build_models: Parquet exports read by the traversal
            eligible_users/shard_id=N/*.parquet
            follow_exclusions/shard_id=N/*.parquet
            candidate_profiles.parquet  popularity_index.parquet  hub_accounts.parquet
        graph/                          build_graph: capped CSR, memory-mapped read-only
        shards/shard_id=NNN/recommendations.parquet + manifest.json
        validation/                     validate_run: GX results
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

from recs.errors import InvalidDateError, RunNotFoundError, ShardOutOfRangeError

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def parse_snapshot_date(value: str | dt.date) -> dt.date:
    """``YYYY-MM-DD`` (or a date / datetime) to a date. Raises ``InvalidDateError``."""
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value).strip())
    except ValueError:
        raise InvalidDateError(
            f"invalid snapshot date {value!r}: expected YYYY-MM-DD, e.g. 2026-11-01"
        ) from None


def safe_run_id(run_id: str) -> str:
    """A run id usable as one path segment (Airflow's ids contain ``:`` and ``+``)."""
    cleaned = _UNSAFE.sub("_", run_id).strip("._")
    if not cleaned:
        raise RunNotFoundError(f"invalid run id {run_id!r}")
    return cleaned


def default_run_id(snapshot_date: dt.date) -> str:
    """The run id the CLI uses when none is given: ``cli__<snapshot_date>``."""
    return f"cli__{snapshot_date.isoformat()}"


@dataclass(frozen=True)
class RunPaths:
    """The run-scoped folders and files of one run.

    ``as_of`` is the run's reference instant: midnight UTC at the start of the day after the
    snapshot date (the end of the run's data interval). Activity decay and the 30-day
    eligibility window are measured from it, never from the wall clock.
    """

    home: Path
    snapshot_date: dt.date
    run_id: str

    @classmethod
    def create(cls, home: Path, snapshot_date: str | dt.date, run_id: str | None) -> RunPaths:
        day = parse_snapshot_date(snapshot_date)
        return cls(Path(home), day, safe_run_id(run_id or default_run_id(day)))

    @classmethod
    def find(cls, home: Path, snapshot_date: str | dt.date, run_id: str | None = None) -> RunPaths:
        """An existing run of that date: the given run id, or the only/newest one there.

        Raises ``RunNotFoundError`` if no snapshot exists for it.
        """
        day = parse_snapshot_date(snapshot_date)
        date_dir = Path(home) / "runs" / day.isoformat()
        if run_id is not None:
            paths = cls(Path(home), day, safe_run_id(run_id))
        else:
            candidates = sorted(
                (p for p in date_dir.glob("*/snapshot/manifest.json")),
                key=lambda p: p.stat().st_mtime,
            )
            if not candidates:
                raise RunNotFoundError(
                    f"no snapshot for {day.isoformat()} under {date_dir}: run the DAG or "
                    f"`recs run --snapshot-date {day.isoformat()}` first"
                )
            paths = cls(Path(home), day, candidates[-1].parent.parent.name)
        if not paths.snapshot_manifest.exists():
            raise RunNotFoundError(
                f"no snapshot for run {paths.run_id} of {day.isoformat()} ({paths.snapshot_dir})"
            )
        return paths

    @property
    def as_of(self) -> dt.datetime:
        day_after = self.snapshot_date + dt.timedelta(days=1)
        return dt.datetime(day_after.year, day_after.month, day_after.day, tzinfo=dt.UTC)

    @property
    def run_dir(self) -> Path:
        return self.home / "runs" / self.snapshot_date.isoformat() / self.run_id

    @property
    def snapshot_dir(self) -> Path:
        return self.run_dir / "snapshot"

    @property
    def snapshot_manifest(self) -> Path:
        return self.snapshot_dir / "manifest.json"

    @property
    def warehouse(self) -> Path:
        return self.run_dir / "warehouse.duckdb"

    @property
    def exports_dir(self) -> Path:
        return self.run_dir / "exports"

    @property
    def graph_dir(self) -> Path:
        return self.run_dir / "graph"

    @property
    def shards_dir(self) -> Path:
        return self.run_dir / "shards"

    @property
    def validation_dir(self) -> Path:
        return self.run_dir / "validation"

    def shard_dir(self, shard_id: int) -> Path:
        return self.shards_dir / f"shard_id={shard_id:03d}"

    def shard_output(self, shard_id: int) -> Path:
        return self.shard_dir(shard_id) / "recommendations.parquet"

    def shard_manifest(self, shard_id: int) -> Path:
        return self.shard_dir(shard_id) / "manifest.json"


def check_shard(shard_id: int, shard_count: int) -> int:
    """Return ``shard_id`` if it is in ``0 .. shard_count-1``; else ``ShardOutOfRangeError``."""
    if not 0 <= shard_id < shard_count:
        raise ShardOutOfRangeError(
            f"shard {shard_id} is out of range: this run has shards 0..{shard_count - 1}"
        )
    return shard_id
