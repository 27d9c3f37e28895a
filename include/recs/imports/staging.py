"""The working area of one import: a DuckDB database in a temporary folder, outside the store.

Validated rows of every batch are appended to ``accepted`` and rejects to ``rejects`` as they
are read; nothing touches the live store until the whole input has been read. Then:

- ``distinct_rows`` streams the accepted rows in key order (``ORDER BY key, line_number``: the
  order the store's primary key is built in fastest) and drops each row whose key an earlier
  line already had, recording it as a ``duplicate`` of that first line;
- ``reverse_rows`` streams the same distinct rows in reverse-key order (PostgreSQL's
  ``follow_edges_reverse``);
- ``user_summary`` / ``follow_counts`` aggregate the distinct rows per account, computed by a
  helper thread as soon as ``distinct_rows`` has streamed its last row, i.e. while the store
  rebuilds its indexes from them.

DuckDB sorts and aggregates on all cores within ``memory_mb`` and spills to the folder beyond
it, so memory stays bounded by a batch and that limit, whatever the input's size. The folder is
removed on exit; one left by a killed import is removed by the next one (``staging_folder``).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from recs.contracts import TS
from recs.files import atomic_path
from recs.imports.batches import REJECT_SCHEMA
from recs.imports.tables import ImportTable
from recs.imports.validation import accepted_schema, row_text

log = logging.getLogger("recs.imports.staging")

STREAM_BATCH_ROWS = 1 << 18
"""Rows per batch streamed from the staging area to the store."""

_DUCK_TYPES = {pl.Int64: "BIGINT", TS: "TIMESTAMP", pl.String: "VARCHAR", pl.Boolean: "BOOLEAN"}


@contextmanager
def staging_folder(parent: Path) -> Iterator[Path]:
    """A new folder ``parent/import-<pid>``, removed on exit; first removes the folders of
    imports whose process no longer runs (killed: nothing else would remove them)."""
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob("import-*"):
        pid = stale.name.removeprefix("import-")
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    folder = parent / f"import-{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    import psutil

    return psutil.pid_exists(pid)


class Staging:
    """DuckDB staging of one table's import (module docstring). Use as a context manager."""

    def __init__(
        self, table: ImportTable, folder: Path, *, memory_mb: int, threads: int | None = None
    ) -> None:
        import duckdb

        self.table = table
        self.schema = accepted_schema(table)
        self.db = duckdb.connect(
            config={
                "memory_limit": f"{memory_mb}MB",
                "temp_directory": str(folder / "spill"),
                "preserve_insertion_order": False,
                "threads": threads or os.cpu_count() or 1,
            }
        )
        self.db.execute("SET enable_progress_bar = false")  # it prints on stdout (--json)
        columns = ", ".join(f"{name} {_DUCK_TYPES[dtype]}" for name, dtype in self.schema.items())
        self.db.execute(f"CREATE TABLE accepted ({columns})")
        self.db.execute(
            "CREATE TABLE rejects "
            "(line_number BIGINT, reason VARCHAR, detail VARCHAR, line VARCHAR)"
        )
        self.db.execute("CREATE TABLE duplicates (line_number BIGINT)")
        self.accepted_rows = 0
        self.distinct = 0
        self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recs-staging")
        self._summaries: Future | None = None

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc) -> None:
        self._helper.shutdown(wait=True)
        self.db.close()

    # --- filling ------------------------------------------------------------------------------

    def _append(self, table: str, frame: pl.DataFrame, cursor=None) -> None:
        if not frame.height:
            return
        connection = cursor or self.db
        connection.register("incoming", frame.to_arrow())
        try:
            connection.execute(f"INSERT INTO {table} SELECT * FROM incoming")
        finally:
            connection.unregister("incoming")

    def add(self, accepted: pl.DataFrame, rejects: pl.DataFrame) -> None:
        """Append one validated batch (``validate``'s frames)."""
        self._append("accepted", accepted.select(list(self.schema)))
        self._append("rejects", rejects.select(list(REJECT_SCHEMA)))
        self.accepted_rows += accepted.height

    def add_rejects(self, rejects: pl.DataFrame) -> None:
        self._append("rejects", rejects.select(list(REJECT_SCHEMA)))

    def rejected_by_reason(self) -> dict[str, int]:
        rows = self.db.execute(
            "SELECT reason, count(*) FROM rejects GROUP BY reason ORDER BY reason"
        ).fetchall()
        return {reason: count for reason, count in rows}

    # --- streaming out ------------------------------------------------------------------------

    def distinct_rows(
        self, *, users_of: tuple[str, ...] = (), counts: bool = False, times_given: bool = True
    ) -> Iterator[pl.DataFrame]:
        """The accepted rows in ``(key, line_number)`` order, one per key (its first line);
        the others become ``duplicate`` rejects. ``users_of``: id columns whose accounts are
        summarised (``user_summary``); ``counts``: follow counts are summed (``follow_counts``).
        ``times_given``: the rows' time comes from the source (else it is the default, and
        says nothing about activity). Frames have the accepted columns."""
        key = self.table.key
        order = ", ".join([*key, "line_number"])
        cursor = self.db.cursor()
        previous: dict[str, object] | None = None
        first_line: int | None = None
        query = self.db.sql(f"SELECT * FROM accepted ORDER BY {order}")
        with query.to_arrow_reader(batch_size=STREAM_BATCH_ROWS) as reader:
            for batch in reader:
                frame = pl.from_arrow(batch)
                assert isinstance(frame, pl.DataFrame)
                if not frame.height:
                    continue
                repeated = _repeats_previous(frame, key, previous)
                group_first = pl.select(
                    pl.when(~repeated).then(frame["line_number"]).otherwise(None)
                ).to_series()
                group_first = group_first.forward_fill()
                if first_line is not None:  # a key group continued from the batch before
                    group_first = group_first.fill_null(first_line)
                previous = frame.row(-1, named=True)
                first_line = int(group_first[-1])
                if repeated.any():
                    self._note_duplicates(frame, repeated, group_first, cursor)
                    frame = frame.filter(~repeated)
                self.distinct += frame.height
                yield frame
        cursor.close()
        # Summarised in a helper thread while the store rebuilds its indexes from these rows.
        self._summaries = self._helper.submit(self._summarize, users_of, counts, times_given)

    def _summarize(self, users_of: tuple[str, ...], counts: bool, times_given: bool) -> None:
        """The per-account tables ``user_summary`` and ``follow_count`` of the distinct rows
        (``accepted`` without the ``duplicates``), on a cursor of this helper thread."""
        cursor = self.db.cursor()
        kept = "WITH kept AS (SELECT * FROM accepted ANTI JOIN duplicates USING (line_number)) "
        none = "NULL::TIMESTAMP"
        try:
            if users_of:
                time = self.table.time_columns[0] if self.table.time_columns else None
                parts = " UNION ALL ".join(
                    f"SELECT {name} AS user_id, {time or none} AS first_time, "
                    f"{time if time and times_given and name == self.table.actor else none} "
                    "AS last_time FROM kept"
                    for name in users_of
                )
                cursor.execute(
                    f"CREATE TABLE user_summary AS {kept}SELECT user_id, min(first_time) AS "
                    f"created_at, max(last_time) AS last_active_at FROM ({parts}) GROUP BY user_id"
                )
            if counts:
                cursor.execute(
                    f"CREATE TABLE follow_count AS {kept}SELECT user_id, "
                    "sum(followers)::BIGINT AS follower_count, "
                    "sum(following)::BIGINT AS following_count FROM ("
                    "SELECT followee_id AS user_id, 1 AS followers, 0 AS following FROM kept "
                    "WHERE status = 'active' UNION ALL "
                    "SELECT follower_id, 0, 1 FROM kept WHERE status = 'active') GROUP BY user_id"
                )
        finally:
            cursor.close()

    def _note_duplicates(self, frame, repeated, group_first, cursor) -> None:
        dupes = frame.with_columns(first=group_first).filter(repeated)
        key = ", ".join(f"{name} {{}}" for name in self.table.key)
        details = [
            "same " + key.format(*values) + f" as line {first:,}"
            for *values, first in dupes.select([*self.table.key, "first"]).iter_rows()
        ]
        self._append(
            "rejects",
            pl.DataFrame(
                {
                    "line_number": dupes["line_number"],
                    "reason": ["duplicate"] * dupes.height,
                    "detail": details,
                    "line": row_text(dupes, self.table),
                },
                schema=REJECT_SCHEMA,
            ),
            cursor,
        )
        self._append("duplicates", dupes.select("line_number"), cursor)

    def reverse_rows(self, columns: list[str]) -> Iterator[pl.DataFrame]:
        """The distinct rows (after ``distinct_rows`` ran) ordered by the reverse key (the
        second key column first), with ``columns``."""
        left, right = self.table.key[:2]
        query = self.db.sql(
            f"SELECT {', '.join(columns)} FROM accepted "
            "ANTI JOIN duplicates USING (line_number) "
            f"ORDER BY {right}, {left}"
        )
        with query.to_arrow_reader(batch_size=STREAM_BATCH_ROWS) as reader:
            for batch in reader:
                frame = pl.from_arrow(batch)
                assert isinstance(frame, pl.DataFrame)
                yield frame

    def user_summary(self) -> Iterator[pl.DataFrame]:
        """One row per account the distinct rows name, by ``user_id``: ``user_id`` Int64,
        ``created_at`` (the earliest time of its rows) and ``last_active_at`` (the latest time
        of the rows it is the actor of; null if none). After ``distinct_rows(users_of=...)``."""
        return self._stream("SELECT * FROM user_summary ORDER BY user_id")

    def follow_counts(self) -> Iterator[pl.DataFrame]:
        """``user_id, follower_count, following_count`` (Int64) of the distinct active follows,
        one row per account with any, by ``user_id``. After ``distinct_rows(counts=True)``."""
        return self._stream("SELECT * FROM follow_count ORDER BY user_id")

    def _stream(self, sql: str) -> Iterator[pl.DataFrame]:
        if self._summaries is not None:
            self._summaries.result()  # the helper's tables are complete (or its error raised)
        with self.db.sql(sql).to_arrow_reader(batch_size=STREAM_BATCH_ROWS) as reader:
            for batch in reader:
                yield _frame(batch)

    # --- the rejects file ---------------------------------------------------------------------

    def write_rejects(self, path: Path) -> int:
        """Write every reject, by line number, as CSV (``line_number, reason, detail, line``)
        to ``path`` atomically; returns the number of rows."""
        count = self.db.execute("SELECT count(*) FROM rejects").fetchone()[0]
        with atomic_path(path) as tmp:
            self.db.execute(
                f"COPY (SELECT * FROM rejects ORDER BY line_number, reason) TO '{_quoted(tmp)}' "
                "(FORMAT csv, HEADER true)"
            )
        return int(count)


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def _frame(batch) -> pl.DataFrame:
    frame = pl.from_arrow(batch)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _repeats_previous(frame: pl.DataFrame, key: tuple[str, ...], previous) -> pl.Series:
    """Whether each row has the key of the row before it (the first row: of ``previous``, the
    last row of the batch before)."""
    same = None
    for name in key:
        column = frame.get_column(name)
        before = column.shift(1)
        if previous is not None:
            before = before.scatter(0, previous[name])
        equal = (column == before).fill_null(False)
        same = equal if same is None else same & equal
    assert same is not None
    return same
