"""Run-scoped paths: everything a run writes lives under ``runs/<snapshot_date>/<run_id>/``.

Light module (standard library only), importable from DAG files. Nothing here reads the wall
clock: a run is identified by its snapshot date (the DAG run's logical date) and its run id.

Layout of one run (``RunPaths``)::

    runs/<snapshot_date>/<run_id>/
        snapshot/                       freeze_snapshot: Parquet copy of the live store
            users.parquet  blocks.parquet  mutes.parquet  dismissed_candidates.parquet
            user_interests.parquet
            follow_edges/shard_id=NNN/part-0.parquet   (by shard of follower_id)
            in_degrees.parquet          active followers per account, counted from the edges
            manifest.json
        warehouse.duckdb                build_models: the run's one DuckDB file (one writer)
        dbt/target/  dbt/logs/          build_models: dbt's artifacts (run_results.json holds
                                        the run's vars; a rerun's freeze withdraws it) and
                                        log; dbt/docs/: `recs dbt-docs`
        exports/                        build_models: Parquet exports read by the traversal
            eligible_users/shard_id=N/*.parquet
            follow_exclusions/shard_id=N/*.parquet
            candidate_profiles.parquet  popularity_index.parquet  hub_accounts.parquet
        graph_pieces/                   plan_graph: plan.json  reciprocal_pairs.npy
            shard_id=NNN/               cap_graph: one partition's capped follows
        graph/                          build_graph: capped CSR, memory-mapped read-only;
                                        meta.json (counts, settings) written last
        shards/shard_id=NNN/recommendations.parquet + manifest.json (written last: computed)
        validation/                     validate_run: the gate's verdict summary.json, every
                                        check's results.json, Data Docs
            shards/shard_id=NNN/results.json    validate_shards: one shard's gate
        stage_times.json                recs run (run_all): each stage's wall seconds so far
                                        and the stage it stopped at, if one raised; a gate or
                                        publish run alone amends the seconds; a rerun's
                                        freeze withdraws it
        .lock  .locks/                  flock files: the run's lock, each shard's and each
                                        graph piece's (``locks``); a lock dies with its process

Run ids (``check_run_id``): 1 to 64 characters from ``A-Z a-z 0-9 _ . -``, starting with a
letter or digit, without ``..``; anything else is refused, never rewritten. The DAG maps
Airflow's ``:`` ``+`` ``~`` to ``_`` first (``run_id_from_airflow``).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from recs.errors import (
    CorruptFileError,
    InvalidDateError,
    InvalidRunIdError,
    RunNotFoundError,
    ShardOutOfRangeError,
)
from recs.files import RERUN_STAGE
from recs.times import wall_clock

WRITTEN_BY = {
    "snapshot": "freeze_snapshot",
    "exports": "build_models",
    "graph_pieces": "cap_graph",
    "graph": "build_graph",
    "shards": "traverse_shard",
}
"""The stage that writes each folder of a run (the layout above)."""

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What a run id may be (``fullmatch``), and it must not contain ``..``: one path segment,
never hidden, never a parent reference, short enough for every filesystem."""
RUN_ID_RULE = (
    "run ids are 1 to 64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit, "
    "without '..'"
)
_AIRFLOW_SEPARATORS = re.compile(r"[~:+]+")  # in Airflow's allowed_run_id_pattern, not in ours


_DATE_SHAPE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")  # ASCII digits only (\d takes others)


def parse_snapshot_date(value: str | dt.date, what: str = "snapshot date") -> dt.date:
    """``YYYY-MM-DD`` (or a date / datetime) to a date. Raises ``InvalidDateError`` naming
    ``what`` the value was for, and, for the right shape, the calendar's objection
    (``2026-11-31``: day is out of range for month)."""
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    text = str(value)
    if not _DATE_SHAPE.fullmatch(text):  # fromisoformat takes 20261101 and 2026-W44-7 too
        raise InvalidDateError(f"invalid {what} {value!r}: expected YYYY-MM-DD, e.g. 2026-11-01")
    try:
        return dt.date.fromisoformat(text)
    except ValueError as error:
        raise InvalidDateError(f"invalid {what} {value!r}: no such day ({error})") from None


def is_run_id(name: str) -> bool:
    """Whether ``name`` is a run id ``check_run_id`` accepts (a folder named otherwise under
    ``runs/<date>/`` is not a run)."""
    return isinstance(name, str) and bool(RUN_ID_PATTERN.fullmatch(name)) and ".." not in name


def run_dates(home: Path, run_id: str | None = None, *, frozen: bool = True) -> list[str]:
    """The dates (``YYYY-MM-DD``, oldest first) under ``<home>/runs`` that hold a run, of
    ``run_id`` if given (a checked id), whose snapshot is frozen (``frozen``) or whose folder
    merely exists (``_run_folders``)."""
    return sorted({day for day, _, _ in _run_folders(home, "????-??-??", run_id, frozen)})


def frozen_runs(home: Path, day: dt.date) -> list[str]:
    """The run ids of ``day`` that froze their snapshot, the one frozen last at the end (what
    ``RunPaths.find`` picks without a run id; ``_run_folders``)."""
    found = _run_folders(home, day.isoformat(), None, True)
    return [name for _, name, _ in sorted(found, key=lambda f: f[2].stat().st_mtime)]


def _run_folders(
    home: Path, day_glob: str, run_id: str | None, frozen: bool
) -> list[tuple[str, str, Path]]:
    """``(date, run id, match)`` of the run folders under ``<home>/runs/<day_glob>/``, of
    ``run_id`` if given (a checked id); the match is the snapshot's manifest when ``frozen``
    (only runs that froze), else the folder. The one rule of what is a run's folder: folders
    that are not dates (``backup``, ``2026-13-01``) or not named as runs (``.trash``, ``backup
    copy``) are passed over."""
    runs = Path(home) / "runs"
    pattern = f"{day_glob}/{run_id or '*'}" + ("/snapshot/manifest.json" if frozen else "")
    found = []
    for match in runs.glob(pattern):
        day, name = match.relative_to(runs).parts[:2]
        try:
            dt.date.fromisoformat(day)
        except ValueError:
            continue  # not a date a run could have
        if is_run_id(name):
            found.append((day, name, match))
    return found


def check_run_id(run_id: str) -> str:
    """``run_id`` itself if it matches ``RUN_ID_PATTERN`` and holds no ``..``; otherwise
    ``InvalidRunIdError`` naming the rule. Never rewrites: ``../../x`` is refused, not turned
    into ``x``, and ``""`` is refused, not taken as "the default"."""
    if not is_run_id(run_id):
        hint = ""
        if isinstance(run_id, str) and _AIRFLOW_SEPARATORS.search(run_id):
            try:  # Airflow's own spelling of a run id: name the folder it runs in
                hint = f" (an Airflow run id? its run is {run_id_from_airflow(run_id)!r})"
            except InvalidRunIdError:
                pass
        raise InvalidRunIdError(f"invalid run id {run_id!r}: {RUN_ID_RULE}{hint}")
    return run_id


def run_id_from_airflow(dag_run_id: str) -> str:
    """The run id of an Airflow DAG run: its ``~``, ``:`` and ``+`` (allowed by Airflow's
    ``[scheduler] allowed_run_id_pattern``, not by ours) become ``_``, so
    ``scheduled__2026-11-01T01:00:00+00:00`` runs in ``scheduled__2026-11-01T01_00_00_00_00``;
    the result must then pass ``check_run_id``. Raises ``InvalidRunIdError`` quoting the
    Airflow id (e.g. a manual run triggered as ``..`` or with a 70-character id)."""
    mapped = _AIRFLOW_SEPARATORS.sub("_", str(dag_run_id))
    if not RUN_ID_PATTERN.fullmatch(mapped) or ".." in mapped:
        raise InvalidRunIdError(f"invalid run id {dag_run_id!r}: {RUN_ID_RULE}")
    return mapped


CLI_RUN_ID_PREFIX = "cli__"
"""How the CLI's default run ids begin (Airflow's begin with the run type, ``scheduled__``...)."""


def default_run_id(snapshot_date: dt.date) -> str:
    """The run id the CLI uses when none is given: ``cli__<snapshot_date>``."""
    return f"{CLI_RUN_ID_PREFIX}{snapshot_date.isoformat()}"


DBT_RUN_RESULTS = Path("dbt") / "target" / "run_results.json"
"""``build_models``' dbt run results, relative to the run folder (what the run report reads)."""


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
        """The paths of a run; ``run_id`` None means ``default_run_id``. Raises
        ``InvalidDateError`` or ``InvalidRunIdError`` (``check_run_id``)."""
        day = parse_snapshot_date(snapshot_date)
        return cls(Path(home), day, default_run_id(day) if run_id is None else check_run_id(run_id))

    @classmethod
    def find(cls, home: Path, snapshot_date: str | dt.date, run_id: str | None = None) -> RunPaths:
        """An existing run of that date: the given run id, or the only/newest one there.

        Raises ``RunNotFoundError`` if no snapshot exists for it, ``InvalidRunIdError`` for a
        run id outside ``RUN_ID_PATTERN``.
        """
        day = parse_snapshot_date(snapshot_date)
        date_dir = Path(home) / "runs" / day.isoformat()
        if run_id is not None:
            paths = cls(Path(home), day, check_run_id(run_id))
        else:
            candidates = frozen_runs(home, day)
            if not candidates:
                raise RunNotFoundError(
                    f"no run of {day.isoformat()} under {date_dir} (none has frozen its "
                    f"snapshot): run the DAG or `recs run --snapshot-date {day.isoformat()}` "
                    f"first{_remedy(Path(home), day)}"
                )
            paths = cls(Path(home), day, candidates[-1])
        if not paths.snapshot_manifest.exists():
            raise RunNotFoundError(
                f"no run {paths.run_id} of {day.isoformat()}, or it has not frozen its snapshot "
                f"yet ({paths.snapshot_dir})"
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

    @property
    def validation_summary(self) -> Path:
        """The gate's verdict (``validation.validate_run``; ``publish`` requires it passed)."""
        return self.validation_dir / "summary.json"

    @property
    def validation_results(self) -> Path:
        """Every check of the gate's last verdict (``validation.validate_run``)."""
        return self.validation_dir / "results.json"

    @property
    def stage_times(self) -> Path:
        return self.run_dir / "stage_times.json"

    @property
    def dbt_run_results(self) -> Path:
        return self.run_dir / DBT_RUN_RESULTS

    def shard_dir(self, shard_id: int) -> Path:
        return self.shards_dir / f"shard_id={shard_id:03d}"

    def shard_output(self, shard_id: int) -> Path:
        return self.shard_dir(shard_id) / "recommendations.parquet"

    def shard_manifest(self, shard_id: int) -> Path:
        return self.shard_dir(shard_id) / "manifest.json"

    def shard_validation(self, shard_id: int) -> Path:
        return self.validation_dir / "shards" / f"shard_id={shard_id:03d}" / "results.json"


def check_shard(shard_id: int, shard_count: int) -> int:
    """Return ``shard_id`` if it is in ``0 .. shard_count-1``; else ``ShardOutOfRangeError``."""
    if not 0 <= shard_id < shard_count:
        raise ShardOutOfRangeError(
            f"shard {shard_id} is out of range: this run has shards 0..{shard_count - 1}"
        )
    return shard_id


def _remedy(home: Path, day: dt.date) -> str:
    """What a first run of ``day`` needs, for the "no run" message: the day to be over, or, for
    a past date with no snapshot retained here, perhaps ``--rebuild-snapshot`` (a newcomer ran
    the command the message named for a month-old date and was refused: the store had moved
    past it)."""
    from recs.nightly import retained  # it builds on RunPaths: imported when needed

    cut_off = day + dt.timedelta(days=1)
    if wall_clock() < dt.datetime.combine(cut_off, dt.time()):
        return f", once the day is over ({cut_off.isoformat()} 00:00 UTC)"
    if retained.is_complete(retained.folder(home, day)):
        return " (it reuses the date's retained snapshot)"
    return (
        "; no snapshot of that date is retained here, so give that `recs run` --rebuild-snapshot "
        "(the DAG's rebuild_snapshot param) if the live store has moved past it (README, "
        "'Backfills and reruns')"
    )


def shard_rerun_command(paths: RunPaths, shard_id: int) -> str:
    """The command, in backquotes, that computes shard ``shard_id`` of ``paths``' run again."""
    return (f"`recs shard run --snapshot-date {paths.snapshot_date.isoformat()} --run-id "
            f"{paths.run_id} --shard {shard_id}`")  # fmt: skip


@contextmanager
def naming_the_stage(paths: RunPaths) -> Iterator[None]:
    """Re-raise a ``CorruptFileError`` about a file of ``paths``' run with the stage that writes
    it and the command that runs that stage again (``WRITTEN_BY``): "rerun the stage that
    wrote it" alone left a newcomer to find both. Other errors pass unchanged."""
    try:
        yield
    except CorruptFileError as damaged:
        try:
            parts = Path(damaged.path).relative_to(paths.run_dir).parts
        except (TypeError, ValueError):  # no path, or not one of this run's files
            raise damaged from None
        stage = WRITTEN_BY.get(parts[0]) if len(parts) > 1 else None
        if stage is None:
            raise
        where = str(damaged).removesuffix(f": {RERUN_STAGE}")
        day = paths.snapshot_date.isoformat()
        shard = parts[1].removeprefix("shard_id=")
        if stage == "traverse_shard" and shard.isdigit():
            remedy = f"{shard_rerun_command(paths, int(shard))} writes it again"
        elif stage == "freeze_snapshot":
            remedy = (f"`recs run --snapshot-date {day} --run-id {paths.run_id}` makes the "
                      "run's snapshot again from the date's retained one, which it checks first "
                      "(its files are often the same: hard links)")  # fmt: skip
        else:
            remedy = (f"`recs run --snapshot-date {day} --run-id {paths.run_id}` runs the night "
                      "again from its retained snapshot (in Airflow: clear that task and the "
                      "ones after it)")  # fmt: skip
        raise CorruptFileError(f"{where}: written by {stage}; {remedy}", damaged.path) from None
