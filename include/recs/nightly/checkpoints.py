"""Great Expectations plumbing of the gate: batches of expectations run as GX 1.x Checkpoints.

Each ``GateBatch`` (one Polars frame, its expectations, its key columns) gets its own suite,
validation definition and checkpoint on one ephemeral context (pandas datasource, dataframe
asset, whole-dataframe batch definition): GX 1.x applies one ``batch_parameters`` dict to every
validation definition of a checkpoint, and an in-memory frame is passed exactly that way, so one
checkpoint can validate only one frame. The results are merged into one JSON document, and the
same context renders them as GX's own HTML Data Docs into ``validation/data_docs/`` (a local
filesystem site; ``build_data_docs``). Which expectations the gate holds:
``recs.nightly.validation``; why pandas batches and how they are converted:
``recs/nightly/README.md``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from recs import collector, deferred
from recs.files import staging_name
from recs.nightly.data_docs import use_local_assets
from recs.nightly.runs import RunPaths

DATA_DOCS_DIR = "data_docs"
DATA_DOCS_SITE = "recs_gate"

log = logging.getLogger(__name__)


@dataclass
class GateBatch:
    """One frame to validate, its expectations ``[(check name, expectation)]`` and its keys."""

    name: str
    frame: pl.DataFrame
    keys: list[str]
    expectations: list[tuple[str, Any]] = field(default_factory=list)

    def expect(self, check: str, expectation_class: type, **kwargs: Any) -> None:
        """Add an expectation named ``check`` (kept in its ``meta`` to name its result)."""
        self.expectations.append((check, expectation_class(**kwargs, meta={"check": check})))


def run_checkpoints(
    batches: list[GateBatch],
    paths: RunPaths,
    *,
    label: str | None = None,
    data_docs: bool = True,
    saved_results: list[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Validate each batch with its own suite, validation definition and checkpoint.

    One ephemeral GX context, analytics and progress bars off. The GX run id is the run's id
    and ``paths.as_of`` (not the wall clock), so the saved document is the same on a rerun.
    ``label`` (e.g. ``shard_007``) is appended to each batch's GX asset name, so the results of
    the same batch of several shards stay apart in one Data Docs site. ``data_docs``: build the
    run's site (``build_data_docs``) from this call's results and ``saved_results`` (the
    ``gx_results`` of earlier calls, e.g. one per shard task). The document also holds
    ``gx_results``: GX's validation results of this call, serialized by its store.
    Returns ``{"run_id", "success", "statistics", "data_docs", "checkpoints": [{"name", "batch",
    "rows", "success", "statistics", ["error"], "expectations": [{"name", "expectation_type",
    "kwargs", "success", "errored", "result", ["exception", "exception_info"]}]}]}``,
    expectations in suite order. ``errored`` marks a result GX could not compute (an exception
    in the result, e.g. a failed metric, which GX reports as ``success: false``); a checkpoint
    that raised is recorded with its ``error`` and every expectation of its batch errored, and
    the other batches still run. ``data_docs`` is the path of the Data Docs' ``index.html``
    (``build_data_docs``), None if they could not be built.
    """
    quiet_gx()
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    datasource = context.data_sources.add_pandas("recs_run")
    run_id = RunIdentifier(run_name=paths.run_id, run_time=paths.as_of)

    checkpoints = []
    for batch in batches:
        asset = datasource.add_dataframe_asset(f"{batch.name}_{label}" if label else batch.name)
        batch_definition = asset.add_batch_definition_whole_dataframe("whole_frame")
        suite = gx.ExpectationSuite(name=f"recs_{batch.name}")
        for _, expectation in batch.expectations:
            suite.add_expectation(expectation)
        suite = context.suites.add(suite)
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=f"recs_{batch.name}", data=batch_definition, suite=suite)
        )
        keys = [k for k in batch.keys if k in batch.frame.columns]
        detail: dict[str, Any] = {"result_format": "SUMMARY"}
        if keys == batch.keys:
            detail["unexpected_index_column_names"] = keys
        checkpoint = context.checkpoints.add(
            gx.Checkpoint(
                name=f"recs_gate_{batch.name}",
                validation_definitions=[definition],
                result_format={"result_format": "BASIC"},
            )
        )
        try:
            frame = _to_pandas(batch.frame)
            result = checkpoint.run(batch_parameters={"dataframe": frame}, run_id=run_id)
        except Exception as error:  # noqa: BLE001 - an engine error is an outcome of its own
            log.exception("GX checkpoint %s raised", checkpoint.name)
            checkpoints.append(_describe_raised(batch, checkpoint.name, error))
            continue
        if not result.success:
            # again with examples of the failing rows and their keys (replacing the stored
            # result): only a failing batch pays for them, ~7 % of a passing gate's time
            # (bench/README.md, "The whole night at 1 M users")
            try:
                checkpoint.result_format = detail
                checkpoint.save()
                result = checkpoint.run(batch_parameters={"dataframe": frame}, run_id=run_id)
            except Exception:  # noqa: BLE001 - the verdict stands, without its examples
                log.warning("GX checkpoint %s: the failing rows' examples could not be computed; "
                            "its verdict stands without them", checkpoint.name, exc_info=True)
        checkpoints.append(_describe(batch, result))

    evaluated = sum(len(c["expectations"]) for c in checkpoints)
    successful = sum(e["success"] for c in checkpoints for e in c["expectations"])
    store = context.validation_results_store
    # the store's own serialized text, read from its backend: a get would parse it and a
    # serialize print it again, the same text (0.57 s for a night's 64 results at 1 M users)
    gx_results = [
        {"key": list(key.to_tuple()), "value": store.store_backend.get(store.key_to_tuple(key))}
        for key in store.list_keys()
    ]
    docs = None
    if data_docs:
        _restore_results(context, saved_results)
        docs = build_data_docs(context, paths)
    return {
        "run_id": paths.run_id,
        "snapshot_date": paths.snapshot_date.isoformat(),
        "success": all(c["success"] for c in checkpoints),
        "statistics": {
            "evaluated_expectations": evaluated,
            "successful_expectations": successful,
            "unsuccessful_expectations": evaluated - successful,
        },
        "data_docs": str(docs) if docs else None,
        "checkpoints": checkpoints,
        "gx_results": gx_results,
    }


def _restore_results(context: Any, saved: list[dict[str, Any]]) -> None:
    """Put validation results serialized by ``run_checkpoints`` (``gx_results``) back into
    ``context``'s store, so its Data Docs render them too. One that cannot be read is logged
    and left out: the docs are a view of the results, not the verdict."""
    from great_expectations.data_context.types.resource_identifiers import (
        ValidationResultIdentifier,
    )

    store = context.validation_results_store
    for item in saved:
        try:
            key = ValidationResultIdentifier.from_tuple(tuple(item["key"]))
            store.deserialize(item["value"])  # raises on text the store could not read back
            # the text as the store serialized it, into its backend (``store.set`` would
            # serialize the parsed result again: the same text, 0.4-0.5 s more at 1 M users)
            store.store_backend.set(store.key_to_tuple(key), item["value"])
        except Exception as error:  # noqa: BLE001
            log.warning("a saved GX result could not be restored for Data Docs: %s: %s",
                        type(error).__name__, error)  # fmt: skip


def build_data_docs(context: Any, paths: RunPaths) -> Path | None:
    """Render the context's validation results (this run's checkpoints) as GX Data Docs.

    A local filesystem site (``TupleFilesystemStoreBackend``) is built into a staging folder
    beside ``paths.validation_dir / DATA_DOCS_DIR`` and swapped in, so a rerun replaces the
    previous attempt's site whole; the staging folders of killed attempts (Ctrl-C) go first
    (the caller holds the run's lock). Returns the site's ``index.html``; None (logged) if GX
    could not build it: the docs show the verdict, they are not part of it.
    """
    target = paths.validation_dir / DATA_DOCS_DIR
    for leftover in paths.validation_dir.glob(f".{DATA_DOCS_DIR}.*"):  # staging_name's
        shutil.rmtree(leftover, ignore_errors=True)
    staging = paths.validation_dir / staging_name(DATA_DOCS_DIR, ".staging")
    site = {
        "class_name": "SiteBuilder",
        "show_how_to_buttons": False,
        "store_backend": {
            "class_name": "TupleFilesystemStoreBackend",
            "base_directory": os.path.abspath(staging),  # GX refuses a relative one
        },
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    }
    try:
        paths.validation_dir.mkdir(parents=True, exist_ok=True)
        context.add_data_docs_site(DATA_DOCS_SITE, site)
        context.build_data_docs(site_names=[DATA_DOCS_SITE])
        use_local_assets(staging)  # GX's pages load their scripts from CDNs
        aside = paths.validation_dir / staging_name(DATA_DOCS_DIR, ".old")
        if target.exists():
            os.rename(target, aside)
        os.rename(staging, target)
        shutil.rmtree(aside, ignore_errors=True)
    except Exception as error:  # noqa: BLE001 - docs are a view of the results, not the verdict
        log.warning("validate %s: GX Data Docs could not be built: %s: %s", paths.run_id,
                    type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        log.debug("GX Data Docs build failure", exc_info=True)
        shutil.rmtree(staging, ignore_errors=True)
        return None
    return target / "index.html"


#: GX's pandas engine fingerprints every in-memory batch below this many bytes (an MD5 of
#: ``pandas.util.hash_pandas_object``, or of the pickled frame when a column holds lists, as
#: ``followed_by`` does) only to record it as a batch marker. The gate never reads it, and it
#: was a quarter of a shard's gate CPU (0.8 of 3.0 s, 775 k rows: ``bench/README.md``), so it
#: is off: 0 bytes.
GX_FINGERPRINT_MAX_BYTES = 0


#: Modules GX imports with its own import only for expectations the gate never holds
#: (``from scipy import stats`` for KL divergence and the KS tests, ``import altair`` for the
#: KL divergence's chart): loaded on their first use instead (``recs.deferred``). Paid by every
#: gate task and by ``validate_run``: ``scipy.stats`` was 1.7 s of GX's 4.1 s import here
#: (``python -X importtime``), ``altair`` 0.12 CPU-s and 21 MB of peak RSS of the 1.7 CPU-s
#: and 230 MB of a process that imports GX (bench/README.md, "The night at scale").
GX_DEFERRED_MODULES = ("scipy.stats", "altair")


def quiet_gx() -> None:
    """Import GX quietly: analytics off (unless ``GX_ANALYTICS_ENABLED`` is set) and its INFO
    chatter (hundreds of lines at import, temp-dir notices) kept out of task logs. GX sets
    some module loggers to INFO itself, so those are lowered after the import, which runs with
    the cyclic garbage collector paused (``recs.collector``) and ``GX_DEFERRED_MODULES`` left
    for their first use (``recs.deferred``). Also sets GX's batch fingerprint threshold
    (``GX_FINGERPRINT_MAX_BYTES``)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    gx_logger = logging.getLogger("great_expectations")
    if gx_logger.level == logging.NOTSET:
        gx_logger.setLevel(logging.WARNING)
    for name in GX_DEFERRED_MODULES:
        deferred.defer(name)
    # GX's import makes ~280 k tracked objects and ~3 k cyclic garbage: the ~720 collections
    # it would trigger only cost time (bench/README.md, "The night at scale")
    with collector.paused():
        import great_expectations  # noqa: F401
        from great_expectations.execution_engine import pandas_execution_engine

    pandas_execution_engine.HASH_THRESHOLD = GX_FINGERPRINT_MAX_BYTES

    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (
            name.startswith("great_expectations.")
            and isinstance(logger, logging.Logger)
            and logging.NOTSET < logger.level < logging.WARNING
        ):
            logger.setLevel(logging.WARNING)


def _describe(batch: GateBatch, result: Any) -> dict[str, Any]:
    """A checkpoint result as JSON, each expectation named by its check, in suite order."""
    by_check: dict[str, dict[str, Any]] = {}
    statistics: dict[str, Any] = {}
    for suite_result in result.run_results.values():
        statistics = suite_result.describe_dict()["statistics"]
        for expectation_result in suite_result.results:
            check = expectation_result.expectation_config.meta["check"]
            described = {"name": check, **expectation_result.describe_dict()}
            messages = _exception_messages(expectation_result.exception_info)
            if messages:
                described["exception"] = messages[0]
                described["exception_info"] = expectation_result.exception_info
            by_check[check] = described
    expectations = [by_check[check] for check, _ in batch.expectations]
    for item in expectations:
        item["errored"] = "exception" in item
    return {
        "name": result.name,
        "batch": batch.name,
        "rows": batch.frame.height,
        "success": bool(result.success),
        "statistics": statistics,
        "expectations": json.loads(json.dumps(expectations, default=str)),
    }


def _describe_raised(batch: GateBatch, name: str, error: Exception) -> dict[str, Any]:
    """A checkpoint that raised instead of returning a result: every expectation errored."""
    message = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
    return {
        "name": name,
        "batch": batch.name,
        "rows": batch.frame.height,
        "success": False,
        "statistics": {},
        "error": message,
        "expectations": [
            {"name": check, "success": False, "errored": True, "exception": message}
            for check, _ in batch.expectations
        ],
    }


def _exception_messages(info: Any) -> list[str]:
    """The messages of the exceptions recorded in a GX result's ``exception_info``: either one
    ``{raised_exception, exception_message, ...}`` or, for failed metrics, a mapping of metric
    id to such a record (which ``describe_dict`` leaves out)."""
    if not isinstance(info, dict):
        return []
    if "raised_exception" in info:
        records = [info]
    else:
        records = [value for value in info.values() if isinstance(value, dict)]
    return [
        " ".join(str(record.get("exception_message") or "unknown error").split())[:300]
        for record in records
        if record.get("raised_exception")
    ]


def _to_pandas(frame: pl.DataFrame):
    """Polars to pandas: NumPy dtypes for scalar columns, Arrow-backed list columns."""
    list_columns = [c for c, t in frame.schema.items() if isinstance(t, pl.List)]
    pandas_frame = frame.drop(list_columns).to_pandas()
    for column in list_columns:
        pandas_frame[column] = frame.get_column(column).to_pandas(use_pyarrow_extension_array=True)
    return pandas_frame[frame.columns]
