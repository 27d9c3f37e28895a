"""The ``build_models`` stage: ``dbt build`` of ``dbt_project/`` over one run's snapshot.

dbt on DuckDB does the set logic of the nightly run (ARCHITECTURE §3): hub accounts, follow
exclusions, eligible users, candidate profiles and the popularity index, each tested and
documented, then exported to Parquet for the traversal and the read API (layout in
``recs.nightly.runs``; schemas in ``recs.contracts.EXPORT_SCHEMAS``).

Everything the build writes is run-scoped: the DuckDB file ``paths.warehouse`` (one per run,
opened read-write only by this dbt invocation: the single writer), the exports under
``paths.exports_dir``, and dbt's own target and log folders under ``<run_dir>/dbt/``. Nothing is
written into the repository, and a rerun first removes what the previous attempt wrote.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import recs
from recs import collector
from recs.config import Settings
from recs.contracts import EXPORT_SCHEMAS, check_schema
from recs.errors import ModelsBuildError, RunNotFoundError
from recs.nightly import in_degrees
from recs.nightly.runs import RunPaths

log = logging.getLogger("recs.nightly.models")

PROJECT_DIR_ENV = "RECS_DBT_PROJECT_DIR"
SNAPSHOT_FILES = (
    "users.parquet",
    "blocks.parquet",
    "mutes.parquet",
    "dismissed_candidates.parquet",
    "user_interests.parquet",
    in_degrees.FILE,  # counted by the freeze (recs.nightly.in_degrees)
)
# Exports written as hive-partitioned directories (shard_id=N/*.parquet); the rest are one file.
PARTITIONED_EXPORTS = ("eligible_users", "follow_exclusions")
_FAILED_STATUSES = {"error", "fail", "runtime error"}
DOCS_TARGET = "docs"  # dbt docs generate's target folder under <run_dir>/dbt/
CONSOLE_OFF = ("--log-level", "none", "--log-level-file", "debug")
"""dbt's console output off, its file log (``<run_dir>/dbt/logs/dbt.log``) kept whole: each
finished node is logged here (``_log_node_result``), a failed build is one ``ModelsBuildError``
line naming its nodes, and dbt's console printed a traceback on Ctrl-C."""
# The nightly build runs the models, their data tests and the exports, not the unit tests: those
# test the SQL's logic on fixed inputs, so they belong to CI (tests/dbt): dbt's docs recommend
# running unit tests only in development or CI (docs.getdbt.com/docs/build/unit-tests; the flag:
# docs.getdbt.com/reference/global-configs/resource-type). One sat on the night's longest chain.
NIGHTLY_BUILD_FLAGS = (*CONSOLE_OFF, "--exclude-resource-type", "unit_test")


def dbt_project_dir() -> Path:
    """The dbt project: ``$RECS_DBT_PROJECT_DIR``, else ``dbt_project/`` at the repository root.

    Raises ``ModelsBuildError`` if the folder has no ``dbt_project.yml``.
    """
    override = os.environ.get(PROJECT_DIR_ENV)
    repository = Path(recs.__file__).resolve().parents[2]
    project_dir = Path(override) if override else repository / "dbt_project"
    if not (project_dir / "dbt_project.yml").is_file():
        raise ModelsBuildError(
            f"no dbt project at {project_dir} (set {PROJECT_DIR_ENV} to the dbt_project folder)"
        )
    return project_dir


def dbt_vars(paths: RunPaths, settings: Settings) -> dict[str, Any]:
    """The ``--vars`` of a run: its paths and the frozen settings the models use.

    ``as_of`` is ``paths.as_of`` as naive UTC text (``YYYY-MM-DD HH:MM:SS``);
    ``hub_in_degree_threshold`` is ``None`` (JSON null) when the threshold scales to the graph.
    """
    return {
        "run_dir": paths.run_dir.resolve().as_posix(),
        "duckdb_path": paths.warehouse.resolve().as_posix(),
        "snapshot_date": paths.snapshot_date.isoformat(),
        "as_of": paths.as_of.replace(tzinfo=None).isoformat(sep=" "),
        "shard_count": settings.shard_count,
        "eligibility_window_days": settings.eligibility_window_days,
        "hub_in_degree_threshold": settings.hub_in_degree_threshold,
        "hub_quantile": settings.hub_quantile,
        "hub_min_in_degree": settings.hub_min_in_degree,
        "popularity_per_tag": settings.popularity_per_tag,
        "duckdb_memory_limit": settings.duckdb_memory_limit,
    }


def dbt_args(
    command: str, paths: RunPaths, settings: Settings, *extra: str, target: str = "target"
) -> list[str]:
    """Command-line arguments of a dbt command on this run (for ``dbtRunner().invoke``).

    ``command`` is dbt's sub-command, e.g. ``"build"`` or ``"docs generate"``. The project and
    profile come from ``dbt_project_dir()``; the target folder (``<run_dir>/dbt/<target>``) and
    logs go under ``<run_dir>/dbt/``. After an in-process invocation, call ``release_duckdb()``.
    """
    project_dir = dbt_project_dir()
    dbt_dir = paths.run_dir.resolve() / "dbt"  # dbt resolves a relative one in the project
    return [
        *command.split(),
        "--project-dir", str(project_dir),
        "--profiles-dir", str(project_dir),
        "--target-path", str(dbt_dir / target),
        "--log-path", str(dbt_dir / "logs"),
        "--vars", json.dumps(dbt_vars(paths, settings), sort_keys=True),
        "--no-send-anonymous-usage-stats",
        "--no-version-check",
        "--no-use-colors",
        *extra,
    ]  # fmt: skip


def build_models(paths: RunPaths, settings: Settings) -> dict[str, Any]:
    """Run ``dbt build`` (models, data tests, exports; no unit tests: ``NIGHTLY_BUILD_FLAGS``)
    for one run.

    Reads ``<run_dir>/snapshot/*.parquet``; writes ``paths.warehouse`` (DuckDB) and the Parquet
    exports under ``paths.exports_dir``, whose columns and dtypes are then checked against
    ``recs.contracts.EXPORT_SCHEMAS`` (``eligible_users/`` and ``follow_exclusions/`` are
    hive-partitioned by ``shard_id`` of ``user_id``; the others are single files). The previous
    attempt's warehouse, exports and dbt folders are removed first, so a rerun overwrites.

    Returns ``{"warehouse", "exports_dir", "rows": {export: row count}, "tests_passed",
    "tests_warned", "models_built", "seconds"}`` (paths as strings, seconds wall time).

    Raises ``RunNotFoundError`` if the snapshot is missing, ``ModelsBuildError`` naming the failed
    dbt nodes if the build fails, ``SchemaMismatchError`` if an export breaks its contract.
    """
    runner = _dbt_runner(callbacks=[_log_node_result])
    started = time.perf_counter()
    _check_snapshot(paths)
    _remove_previous_build(paths)
    # DuckDB's COPY creates the partition folders but not their parent.
    paths.exports_dir.mkdir(parents=True, exist_ok=True)

    log.info(
        "dbt build for run %s (snapshot %s, %d shards) into %s",
        paths.run_id, paths.snapshot_date, settings.shard_count, paths.warehouse,
    )  # fmt: skip
    outcome = _invoke(runner, dbt_args("build", paths, settings, *NIGHTLY_BUILD_FLAGS))
    results = list(getattr(outcome.result, "results", None) or [])
    if not outcome.success:
        raise ModelsBuildError(_failure_message(outcome, results, paths))

    rows = _check_exports(paths)
    statuses = [(str(result.node.resource_type), str(result.status)) for result in results]
    tests = [status for kind, status in statuses if kind == "test"]
    summary = {
        "warehouse": str(paths.warehouse),
        "exports_dir": str(paths.exports_dir),
        "rows": rows,
        "tests_passed": tests.count("pass"),
        "tests_warned": tests.count("warn"),
        "models_built": statuses.count(("model", "success")),
        "seconds": round(time.perf_counter() - started, 3),
    }
    log.info(
        "dbt build done in %.1f s: %d models, %d tests passed (%d warned); export rows %s",
        summary["seconds"], summary["models_built"], summary["tests_passed"],
        summary["tests_warned"], rows,
    )  # fmt: skip
    return summary


def generate_docs(paths: RunPaths, settings: Settings) -> dict[str, Any]:
    """``dbt docs generate --static`` for one built run: its lineage and catalog as one page.

    Writes ``<run_dir>/dbt/docs/`` (``DOCS_TARGET``: ``static_index.html``, self-contained,
    plus ``index.html``, ``manifest.json`` and ``catalog.json`` for ``dbt docs serve``), never
    the build's ``dbt/target/`` (whose ``run_results.json`` the run report reads). The catalog
    is read from the run's DuckDB file, so the run must have been built. Returns ``{"docs_dir",
    "static_index", "seconds"}``. Raises ``RunNotFoundError`` if the warehouse is missing,
    ``ModelsBuildError`` if dbt fails.
    """
    runner = _dbt_runner()
    started = time.perf_counter()
    if not paths.warehouse.is_file():
        raise RunNotFoundError(
            f"run {paths.run_id} ({paths.snapshot_date}) has no warehouse at {paths.warehouse}: "
            "build_models has not run, so there is no catalog to document"
        )
    docs_dir = paths.run_dir / "dbt" / DOCS_TARGET
    if docs_dir.exists():
        shutil.rmtree(docs_dir)
    outcome = _invoke(
        runner,
        dbt_args("docs generate", paths, settings, "--static", *CONSOLE_OFF, target=DOCS_TARGET),
    )
    static_index = docs_dir / "static_index.html"
    if not outcome.success or not static_index.is_file():
        detail = " ".join(str(outcome.exception or "no static_index.html written").split())
        raise ModelsBuildError(f"dbt docs generate of run {paths.run_id} failed: {detail}")
    return {
        "docs_dir": str(docs_dir),
        "static_index": str(static_index),
        "seconds": round(time.perf_counter() - started, 3),
    }


def _dbt_runner(callbacks: list[Any] | None = None) -> Any:
    """A ``dbtRunner`` with these event callbacks, dbt imported with the collector paused
    (why: ``_invoke``)."""
    with collector.paused():
        from dbt.cli.main import dbtRunner

    return dbtRunner(callbacks=callbacks or [])


def _invoke(runner: Any, arguments: list[str]) -> Any:
    """``runner.invoke(arguments)`` in this process with the cyclic collector paused, then
    ``release_duckdb()`` (also if dbt raised) and one collection of what dbt left in cycles;
    ``KeyboardInterrupt`` if dbt was interrupted (it returns Ctrl-C as a failed result).

    Why paused: dbt's parse and node bookkeeping make hundreds of thousands of objects, and the
    collections they trigger hold the GIL over every dbt thread. A 1 M-user build with the
    collector running spent 1.51 s in 1,269 collections (0.93 s in 7 full ones; timed with
    ``gc.callbacks``) and its import 0.15 s more; paused, the stage peaked ~60 MiB higher with
    the cycles dbt leaves until the collection here (``bench/README.md``, "The night at
    scale")."""
    try:
        with collector.paused():
            outcome = runner.invoke(arguments)
    finally:
        release_duckdb()
        gc.collect()
    if isinstance(outcome.exception, KeyboardInterrupt):
        raise KeyboardInterrupt  # dbt returns Ctrl-C as a failed result: stop as interrupted
    return outcome


def release_duckdb() -> None:
    """Close the DuckDB database dbt-duckdb keeps open in this process after dbt returns.

    dbt-duckdb caches its DuckDB instance in a class attribute across invocations, so without
    this the run's warehouse stays open read-write after ``build_models`` returns: another
    reader in this process fails ("different configuration"), and a rerun would write into the
    file deleted by ``_remove_previous_build``. Call after every in-process dbt invocation.
    """
    from dbt.adapters.duckdb.connections import DuckDBConnectionManager

    with DuckDBConnectionManager._LOCK:
        environment = DuckDBConnectionManager._ENV
        if environment is not None:
            environment.close()
        DuckDBConnectionManager.close_all_connections()


def _check_snapshot(paths: RunPaths) -> None:
    missing = [name for name in SNAPSHOT_FILES if not (paths.snapshot_dir / name).is_file()]
    if not (paths.snapshot_dir / "follow_edges").is_dir():
        missing.append("follow_edges/")
    if missing == [in_degrees.FILE] and paths.snapshot_manifest.is_file():
        raise RunNotFoundError(
            f"the snapshot of run {paths.run_id} ({paths.snapshot_date}) at {paths.snapshot_dir} "
            f"was frozen by an earlier version of recs, before the freeze counted the in-degrees "
            f"(no {in_degrees.FILE}): run freeze_snapshot again (clear that task); it reuses the "
            "date's retained snapshot and counts them from its edges"
        )
    if missing:
        raise RunNotFoundError(
            f"snapshot of run {paths.run_id} ({paths.snapshot_date}) is incomplete or missing at "
            f"{paths.snapshot_dir}: no {', '.join(missing)}; run freeze_snapshot first"
        )


def _remove_previous_build(paths: RunPaths) -> None:
    """Delete what an earlier attempt of this stage wrote (warehouse, its WAL, exports, dbt/)."""
    for stale in (paths.warehouse, paths.warehouse.with_name(paths.warehouse.name + ".wal")):
        stale.unlink(missing_ok=True)
    # DuckDB's spill folder beside its file (memory_limit): a killed build can leave it full
    shutil.rmtree(paths.warehouse.with_name(paths.warehouse.name + ".tmp"), ignore_errors=True)
    for folder in (paths.exports_dir, paths.run_dir / "dbt"):
        if folder.exists():
            shutil.rmtree(folder)


def _log_node_result(event) -> None:
    """dbt event callback: a log line per finished model (and per failed or warned test)."""
    if event.info.name != "NodeFinished":
        return
    node = event.data.node_info
    status = event.data.run_result.status or node.node_status
    if node.resource_type not in {"model", "test"}:
        return
    if status in {"success", "pass"}:
        level = logging.INFO if node.resource_type == "model" else logging.DEBUG
    else:
        level = logging.WARNING
    seconds = event.data.run_result.execution_time
    log.log(level, "dbt %s %s (%.2f s)", status, node.unique_id, seconds)


def _failure_message(outcome, results: list, paths: RunPaths) -> str:
    """One line naming the failed nodes (or dbt's own error) and where the full log is."""
    log_file = paths.run_dir / "dbt" / "logs" / "dbt.log"
    failed = [
        f"{result.node.unique_id} ({result.status})"
        for result in results
        if str(result.status) in _FAILED_STATUSES
    ]
    if failed:
        skipped = sum(1 for result in results if str(result.status) == "skipped")
        detail = f"{len(failed)} failed: {', '.join(failed)}; {skipped} skipped"
    elif outcome.exception is not None:
        detail = " ".join(str(outcome.exception).split())
    else:
        detail = "no node results"
    return f"dbt build of run {paths.run_id} failed: {detail} (log: {log_file})"


def _check_exports(paths: RunPaths) -> dict[str, int]:
    """Row count of every export; each Parquet file is checked against its contract."""
    import polars as pl
    import pyarrow.parquet as pq

    rows: dict[str, int] = {}
    for name, schema in EXPORT_SCHEMAS.items():
        if name in PARTITIONED_EXPORTS:
            folder = paths.exports_dir / name
            if not folder.is_dir():
                raise ModelsBuildError(f"dbt build did not write the export {folder}")
            files = sorted(folder.glob("shard_id=*/*.parquet"))
        else:
            files = [paths.exports_dir / f"{name}.parquet"]
            if not files[0].is_file():
                raise ModelsBuildError(f"dbt build did not write the export {files[0]}")
        for file in files:
            check_schema(pl.read_parquet_schema(file), schema, f"export {name} ({file})")
        rows[name] = sum(pq.read_metadata(file).num_rows for file in files)
    return rows
