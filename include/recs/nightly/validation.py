"""The Great Expectations gate: nothing is published unless it passes, and it cannot pass empty.

The gate runs in two steps, so its memory grows with a shard, never with the graph:
``shard_gate.validate_shard`` (in the mapped ``validate_shards`` tasks, each a group of shards)
checks one shard's rows, rules, users and files and saves its result; ``validate_run`` (one
task) then reads those results, validates itself any computed shard whose saved result is
missing or is not of the file there now (sha256), adds the run-wide checks and decides. A
shard is *computed* if its manifest and its output are there (the traversal writes the manifest
last); the others *failed*, are left out of the checks and carried over by the publish. The
run-wide batch (``run_batch``), one row:

``run``  at least one row over the computed shards; users with lists >= ``gate_min_list_share``
    of tonight's eligible users in them (``exports/eligible_users``; each shard's own share is
    a check of its ``shards`` batch); the shard plan's eligible
    count equals dbt's; users with lists and rows within ``-gate_max_drop .. gate_max_growth``
    (relative change) of the version ``CURRENT`` names, over the same shards
    (``recs.nightly.baseline``; nothing to compare with: the checks are recorded as skipped).

The shard batches (``recommendations``, ``recommendation_rules``, ``users``, ``shards``) are
defined in ``shard_gate``; ``results.json`` has one checkpoint per batch, each expectation
merged over the shards (``merge_shard_checkpoints``: passed if it passed on every shard, the
counts summed, ``shards_failed`` naming the others), and GX's Data Docs render every shard's
validation and the run's in one site.

Outcomes, each saved in ``validation/results.json`` and ``summary.json`` (``outcome``):
``passed``; ``failed`` (``ValidationFailedError``); ``errored`` (``ValidationEngineError``: GX or
the gate raised, or a result carries an exception); ``nothing_to_validate``
(``NothingToValidateError``: no computed shard, nobody eligible, or an earlier stage missing).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from recs.config import Settings
from recs.errors import (
    NothingToValidateError,
    RecsError,
    ValidationEngineError,
    ValidationFailedError,
)
from recs.files import sha256_file, write_json
from recs.nightly.baseline import ReplacedVersion, change, change_text, replaced_version
from recs.nightly.checkpoints import GateBatch, quiet_gx, run_checkpoints
from recs.nightly.gate_inputs import as_int, missing_upstream, read_manifest, warn_unplanned
from recs.nightly.runs import RunPaths, shard_rerun_command
from recs.nightly.shard_gate import SHARD_BATCHES, saved_result, validate_shard_result
from recs.published import current_version, manifest_digest
from recs.sharding import partition_files

CHANGE_CHECKS = ("users_change_within_bounds", "rows_change_within_bounds")
# Result figures summed over shards when a check is merged (the rest are the first shard's).
_SUMMED = ("element_count", "unexpected_count", "missing_count")
_PARTIAL_LISTS = ("partial_unexpected_list", "partial_unexpected_index_list")
_PARTIAL_MAX = 20  # GX's SUMMARY format keeps 20 examples; so does a merged check

log = logging.getLogger(__name__)


@dataclass
class GateShards:
    """The planned shards as the gate found them: ``computed`` / ``failed`` ids, and the saved
    (or fresh) ``shard_gate`` result of each computed one, by shard id."""

    computed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    results: dict[int, dict[str, Any]] = field(default_factory=dict)
    revalidated: list[int] = field(default_factory=list)

    def total(self, key: str) -> int:
        return sum(int(r.get(key) or 0) for r in self.results.values())

    @property
    def generated_at(self) -> str | None:
        stamps = [r["generated_at"] for r in self.results.values() if r.get("generated_at")]
        return max(stamps) if stamps else None

    @property
    def statuses(self) -> list[dict[str, Any]]:
        """One ``{"shard_id", "status", "sha256", "rows", "users"}`` per planned shard
        (``computed`` or ``failed``; null figures when failed)."""
        statuses = []
        for shard_id in sorted(self.computed + self.failed):
            found = self.results.get(shard_id, {})
            statuses.append({
                "shard_id": shard_id,
                "status": "computed" if shard_id in self.computed else "failed",
                "sha256": found.get("sha256"),
                "rows": found.get("rows"),
                "users": found.get("users"),
            })  # fmt: skip
        return statuses


def gate_shards(paths: RunPaths, settings: Settings) -> GateShards:
    """Sort the planned shards into computed and failed, and get each computed shard's gate
    result: the one ``shard_gate.validate_shard`` saved if it can stand for a check now
    (``shard_gate.saved_result``: the file there now, the same inputs and settings, complete,
    no errored check) and holds every check the other shards' do, else validated here and now
    (``revalidated``), so a lost, stale, partial or damaged result never lets a shard through
    unchecked. Memory: one shard at a time."""
    shards = GateShards()
    warn_unplanned(paths, settings.shard_count)
    for shard_id in range(settings.shard_count):
        output = paths.shard_output(shard_id)
        if not (output.is_file() and paths.shard_manifest(shard_id).is_file()):
            shards.failed.append(shard_id)
            continue
        shards.computed.append(shard_id)
        result = saved_result(paths, settings, shard_id, sha256_file(output))
        if result is None:
            shards.revalidated.append(shard_id)
            result = validate_shard_result(paths, settings, shard_id)
        shards.results[shard_id] = result
    # every shard's result must hold every check that any shard's holds (batch by batch): one
    # that lacks some is validated again here
    names: dict[str, set[str]] = {}
    for result in shards.results.values():
        for checkpoint in result["checkpoints"]:
            names.setdefault(checkpoint["batch"], set()).update(
                e["name"] for e in checkpoint["expectations"]
            )
    for shard_id, result in shards.results.items():
        held = {c["batch"]: {e["name"] for e in c["expectations"]} for c in result["checkpoints"]}
        if shard_id not in shards.revalidated and any(
            held.get(batch, set()) != expected for batch, expected in names.items()
        ):
            shards.revalidated.append(shard_id)
            shards.results[shard_id] = validate_shard_result(paths, settings, shard_id)
    if shards.revalidated:
        log.info("validate %s: validated here (no current saved result): shards %s",
                 paths.run_id, sorted(shards.revalidated))  # fmt: skip
    return shards


def eligible_counts(exports_dir: Path) -> dict[int, int]:
    """Tonight's eligible users per shard, ``{shard_id: count}``, from the row counts of
    ``eligible_users/shard_id=N/*.parquet`` (Parquet metadata: nothing is loaded)."""
    files_by_shard = partition_files(Path(exports_dir) / "eligible_users")
    return {
        shard_id: pl.scan_parquet(files, hive_partitioning=False).select(pl.len()).collect().item()
        for shard_id, files in files_by_shard.items()
    }


def validate_run(paths: RunPaths, settings: Settings) -> dict[str, Any]:
    """Run the gate over a run's computed shards; save the results; raise unless it passed.

    Reads ``paths.shard_output(i)`` / ``paths.shard_manifest(i)`` for ``i < shard_count`` and
    each one's saved result (``shard_gate``), the row counts of ``exports/eligible_users/``, and
    the manifest (and, if its shard count differs, the ``user_id`` column) of the version
    ``CURRENT`` names. Writes ``validation/results.json`` and ``validation/summary.json``
    atomically whatever the outcome (module docstring).

    Returns ``{"run_id", "outcome": "passed", "success", "evaluated", "failed", "skipped",
    "computed_shards", "failed_shards", "compared_with", "rows", "users", "eligible_users",
    "results", "summary", "data_docs", "seconds"}`` (``data_docs``: the GX Data Docs'
    ``index.html`` under ``validation/data_docs/``, None if they could not be built; the
    summary also holds ``current_when_validated`` and ``current_manifest_sha256``, what
    ``CURRENT`` named as the gate compared and that version's manifest digest, which the
    publish checks). Raises,
    after saving: ``ValidationFailedError`` (the failed checks), ``ValidationEngineError`` (the
    checks that could not be evaluated, or the exception), ``NothingToValidateError``; each a
    one-line message naming ``results.json`` and the Data Docs. The wall clock is only read to
    time the stage.
    """
    started = time.perf_counter()
    report = _Report(paths)
    try:
        missing = missing_upstream(paths)
        if missing:
            raise NothingToValidateError(
                f"nothing to validate for run {paths.run_id}: {missing} (an earlier stage did "
                "not complete)"
            )
        quiet_gx()  # imports GX first, so the timings below exclude it
        lap = time.perf_counter()
        shards = gate_shards(paths, settings)
        eligible = eligible_counts(paths.exports_dir)
        report.shards, report.eligible = shards, eligible
        read_seconds = time.perf_counter() - lap
        if not shards.computed:
            raise NothingToValidateError(
                f"nothing to validate for run {paths.run_id}: no shard produced output "
                f"(all {settings.shard_count} failed)"
            )
        if sum(eligible.values()) == 0:
            raise NothingToValidateError(
                f"nothing to validate for run {paths.run_id}: nobody is eligible tonight "
                f"(exports/eligible_users is empty)"
            )
        # what CURRENT named as the gate compared: the publish refuses to make the run current
        # if it names another version by then (publish._refuse_moved_baseline)
        report.current = current_version(settings.published_dir, strict=False)
        report.current_manifest = manifest_digest(settings.published_dir, report.current)
        report.replaced, report.not_compared = replaced_version(
            settings.published_dir, settings.shard_count, shards.computed, paths.run_id
        )
        log.info(
            "validate %s: %d of %d shards computed (%d validated here), %d rows; %.2fs",
            paths.run_id, len(shards.computed), settings.shard_count, len(shards.revalidated),
            shards.total("rows"), read_seconds,
        )
        gate = run_checkpoints(
            [run_batch(paths, settings, shards, eligible, report.replaced)],
            paths,
            saved_results=[g for r in shards.results.values() for g in r.get("gx_results", [])],
        )
        gate.pop("gx_results", None)
        checkpoints = gate["checkpoints"] + merge_shard_checkpoints(shards.results)
        checks = [e for c in checkpoints for e in c["expectations"]]
        successful = sum(bool(e["success"]) for e in checks)
        report.results = {
            **gate,
            "success": all(c["success"] for c in checkpoints),
            "statistics": {
                "evaluated_expectations": len(checks),
                "successful_expectations": successful,
                "unsuccessful_expectations": len(checks) - successful,
            },
            "checkpoints": checkpoints,
        }
    except NothingToValidateError as error:
        report.save("nothing_to_validate", str(error))
        raise
    except Exception as error:  # noqa: BLE001 - any exception of the gate is its own outcome
        known = isinstance(error, RecsError)  # a condition with its line (a damaged CURRENT)
        text = " ".join(str(error).split())
        message = (  # a known line whole: it is said only here, with its remedy (a review's)
            f"validation errored for run {paths.run_id}: {type(error).__name__}: "
            f"{text if known else text[:300]}"
        )
        if not known:  # a defect: its traceback, for the report
            log.exception("validate %s: the gate raised", paths.run_id)
        # a known condition is said once, by the error raised below: a log line of it too
        # printed it twice above `recs: error` (a newcomer's)
        results_path = report.save("errored", message)
        raise ValidationEngineError(f"{message} (details: {results_path})") from error

    checks = [e for c in report.results["checkpoints"] for e in c["expectations"]]
    errored = [e["name"] for e in checks if e.get("errored")]
    failed = [e["name"] for e in checks if not e["success"] and not e.get("errored")]
    evaluated = len(checks)
    docs = report.results.get("data_docs") or "not built"
    if errored:
        results_path = report.save("errored", None, failed=failed, errored=errored)
        first = next(e for e in checks if e.get("errored"))
        named = ", ".join(errored[:5]) + (f" and {len(errored) - 5} more" if errored[5:] else "")
        raise ValidationEngineError(
            f"validation errored for run {paths.run_id}: {len(errored)} of {evaluated} checks "
            f"could not be evaluated ({named}): {first.get('exception')} "
            f"(details: {results_path}; Data Docs: {docs}); this is not a verdict on the data"
        )
    if failed:
        results_path = report.save("failed", None, failed=failed)
        raise ValidationFailedError(
            f"validation failed for run {paths.run_id}: {len(failed)} of {evaluated} "
            f"expectations failed: {_failed_text(checks, paths)}"
            f"{_change_text(report, settings, failed)} "
            f"(details: {results_path}; Data Docs: {docs})"
        )
    results_path = report.save("passed", None)
    summary = report.summary
    log.info(
        "validate %s: %d of %d expectations passed, %d skipped, shards carried over: %s "
        "(%.2fs); results: %s; Data Docs: %s",
        paths.run_id,
        evaluated,
        evaluated,
        len(summary["skipped"]),
        summary["failed_shards"] or "none",
        time.perf_counter() - started,
        results_path,
        docs,
    )
    return {
        "run_id": paths.run_id,
        **{
            key: summary[key]
            for key in (
                "outcome",
                "success",
                "evaluated",
                "failed",
                "skipped",
                "computed_shards",
                "failed_shards",
                "compared_with",
                "rows",
                "users",
                "eligible_users",
            )
        },
        "results": str(results_path),
        "summary": str(paths.validation_summary),
        "data_docs": report.results.get("data_docs"),
        "seconds": round(time.perf_counter() - started, 3),
    }


@dataclass
class _Report:
    """What the gate learned so far, saved as ``results.json`` + ``summary.json`` whatever
    the outcome (``save``)."""

    paths: RunPaths
    shards: GateShards | None = None
    eligible: dict[int, int] | None = None
    replaced: ReplacedVersion | None = None
    not_compared: str | None = None
    current: str | None = None
    current_manifest: str | None = None
    results: dict[str, Any] | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    def save(
        self,
        outcome: str,
        error: str | None,
        failed: list[str] | None = None,
        errored: list[str] | None = None,
    ) -> Path:
        """Write both documents atomically; return the path of ``results.json``."""
        paths = self.paths
        results = self.results or {
            "run_id": paths.run_id,
            "snapshot_date": paths.snapshot_date.isoformat(),
            "success": False,
            "checkpoints": [],
        }
        results = {**results, "outcome": outcome, "error": error, "skipped": self.skipped()}
        shards = self.shards or GateShards()
        eligible = self.eligible
        self.summary = {
            "run_id": paths.run_id,
            "snapshot_date": paths.snapshot_date.isoformat(),
            "outcome": outcome,
            "success": outcome == "passed",
            "error": error,
            "evaluated": sum(len(c["expectations"]) for c in results["checkpoints"]),
            "failed": failed or [],
            "errored": errored or [],
            "skipped": self.skipped(),
            "computed_shards": shards.computed,
            "failed_shards": shards.failed,
            "compared_with": self.replaced.run_id if self.replaced else None,
            "current_when_validated": self.current,
            "current_manifest_sha256": self.current_manifest,
            "rows": shards.total("rows"),
            "users": shards.total("users"),
            "eligible_users": sum(eligible.values()) if eligible is not None else None,
            "eligible_users_in_computed_shards": (
                sum(eligible.get(s, 0) for s in shards.computed) if eligible is not None else None
            ),
            "replaced_users": self.replaced.users if self.replaced else None,
            "replaced_rows": self.replaced.rows if self.replaced else None,
            "generated_at": shards.generated_at,
            "shards": shards.statuses if self.shards is not None else [],
        }
        results_path = write_json(paths.validation_results, results)
        write_json(paths.validation_summary, self.summary)
        return results_path

    def skipped(self) -> list[dict[str, str]]:
        """The comparison checks not run, each with the reason (empty once compared)."""
        if self.replaced is not None or self.not_compared is None:
            return []
        return [{"name": name, "reason": self.not_compared} for name in CHANGE_CHECKS]


def _change_text(report: _Report, settings: Settings, failed: list[str]) -> str:
    """``baseline.change_text`` when a change check failed against a replaced version, else
    empty."""
    if report.replaced is None or not set(CHANGE_CHECKS) & set(failed):
        return ""
    return change_text(report.paths, report.summary, report.replaced, settings,
                       others_failed=not set(failed) <= set(CHANGE_CHECKS))  # fmt: skip


def run_figures(
    paths: RunPaths,
    shards: GateShards,
    eligible: dict[int, int],
    replaced: ReplacedVersion | None,
) -> pl.DataFrame:
    """The ``run`` batch's one row: ``run_id`` String, ``rows, users, eligible_users`` Int64
    (over the computed shards), ``list_share`` Float64 (users / eligible_users; 0.0 when no
    eligible user is in them), ``users_change, rows_change`` Float64 (``tonight / replaced -
    1``; null without a replaced version), ``eligible_all`` Int64 (every row of the
    ``eligible_users`` export) and ``eligible_planned`` Int64 (the count the shard plan was
    sized by, ``snapshot/manifest.json``'s ``shard_plan``; null for a run frozen without one)."""
    rows, users = shards.total("rows"), shards.total("users")
    in_computed = sum(eligible.get(shard_id, 0) for shard_id in shards.computed)
    plan = read_manifest(paths.snapshot_manifest).get("shard_plan") or {}
    return pl.DataFrame(
        {
            "run_id": [paths.run_id],
            "rows": [rows],
            "users": [users],
            "eligible_users": [in_computed],
            "list_share": [users / in_computed if in_computed else 0.0],
            "users_change": [change(users, replaced.users) if replaced else None],
            "rows_change": [change(rows, replaced.rows) if replaced else None],
            "eligible_all": [sum(eligible.values())],
            "eligible_planned": [as_int(plan.get("eligible_users"))],
        },
        schema={
            "run_id": pl.String,
            "rows": pl.Int64,
            "users": pl.Int64,
            "eligible_users": pl.Int64,
            "list_share": pl.Float64,
            "users_change": pl.Float64,
            "rows_change": pl.Float64,
            "eligible_all": pl.Int64,
            "eligible_planned": pl.Int64,
        },
    )


def run_batch(
    paths: RunPaths,
    settings: Settings,
    shards: GateShards,
    eligible: dict[int, int],
    replaced: ReplacedVersion | None = None,
) -> GateBatch:
    """The run-wide batch and its expectations (module docstring). ``eligible``:
    ``eligible_counts``; ``replaced``: the counts of the version the run would replace
    (``recs.nightly.baseline``), None to skip the change checks."""
    quiet_gx()
    import great_expectations.expectations as gxe

    between = gxe.ExpectColumnValuesToBeBetween
    run = GateBatch("run", run_figures(paths, shards, eligible, replaced), ["run_id"])
    run.expect("rows_at_least_one", between, column="rows", min_value=1)
    run.expect(
        "list_share_at_least_min",
        between,
        column="list_share",
        min_value=settings.gate_min_list_share,
        max_value=1.0,
    )
    # The plan's count (the snapshot's own spelling of the eligibility rule) must equal dbt's
    # eligible_users: the rule has one meaning, whichever code evaluates it.
    run.expect(
        "plan_eligible_matches_models",
        gxe.ExpectColumnPairValuesToBeEqual,
        column_A="eligible_planned",
        column_B="eligible_all",
        ignore_row_if="either_value_is_missing",
    )
    if replaced is not None:
        for check, column in zip(CHANGE_CHECKS, ("users_change", "rows_change"), strict=True):
            run.expect(
                check,
                between,
                column=column,
                min_value=-settings.gate_max_drop,
                max_value=settings.gate_max_growth,
            )
    return run


_DAMAGED_SHARD_CHECKS = (
    "shard_output_readable", "shard_manifest_readable", "shard_schema_matches_contract"
)
"""Shard checks a damaged or foreign file fails: a rerun of the shard writes it again."""


def _failed_text(checks: list[dict[str, Any]], paths: RunPaths) -> str:
    """The failed checks, each with the shards it failed in (``shards_failed``), and for a
    damaged shard file the command that writes it again (a newcomer had to find it)."""
    failed = [e for e in checks if not e["success"] and not e.get("errored")]
    named = ", ".join(e["name"] + _shards_text(e.get("shards_failed") or []) for e in failed)
    damaged = sorted({s for e in failed if e["name"] in _DAMAGED_SHARD_CHECKS
                      for s in e.get("shards_failed") or []})  # fmt: skip
    if not damaged:
        return named
    return (
        f"{named}; write a damaged shard again with {shard_rerun_command(paths, damaged[0])}"
        f"{' (and each other shard named)' if damaged[1:] else ''}, then validate again"
    )


def _shards_text(shard_ids: list[int]) -> str:
    if not shard_ids:
        return ""
    return f" (shard{'s' if shard_ids[1:] else ''} {', '.join(f'{s:03d}' for s in shard_ids)})"


def merge_shard_checkpoints(results: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """One checkpoint per shard batch (``SHARD_BATCHES`` order) from the shards' results
    (``{shard_id: result}``): ``rows`` summed, ``shards`` the ids, ``success`` if every shard's
    was, ``error`` the first shard's that raised. Each expectation, by name in suite order: the
    first failing shard's description (else the first shard's) with ``success`` over all shards,
    ``errored`` if any errored, ``shards_failed`` the ids where it did not pass, and in
    ``result`` the ``_SUMMED`` counts summed, ``unexpected_percent`` recomputed from them and
    the partial lists of the failing shards joined (at most ``_PARTIAL_MAX``)."""
    merged = []
    for batch in SHARD_BATCHES:
        parts = [
            (shard_id, checkpoint)
            for shard_id, result in sorted(results.items())
            for checkpoint in result.get("checkpoints", [])
            if checkpoint.get("batch") == batch
        ]
        if not parts:
            continue
        by_name: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for shard_id, checkpoint in parts:
            for expectation in checkpoint["expectations"]:
                by_name.setdefault(expectation["name"], []).append((shard_id, expectation))
        expectations = [_merge_expectation(items) for items in by_name.values()]
        errors = [c["error"] for _, c in parts if c.get("error")]
        successful = sum(bool(e["success"]) for e in expectations)
        merged.append({
            "name": f"recs_gate_{batch}",
            "batch": batch,
            "rows": sum(int(c.get("rows") or 0) for _, c in parts),
            "shards": [shard_id for shard_id, _ in parts],
            "success": all(c["success"] for _, c in parts),
            "statistics": {
                "evaluated_expectations": len(expectations),
                "successful_expectations": successful,
                "unsuccessful_expectations": len(expectations) - successful,
            },
            **({"error": errors[0]} if errors else {}),
            "expectations": expectations,
        })  # fmt: skip
    return merged


def _merge_expectation(items: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    failing = [(shard_id, e) for shard_id, e in items if not e["success"]]
    base = dict((failing or items)[0][1])
    result = dict(base.get("result") or {})
    for key in _SUMMED:
        values = [e.get("result", {}).get(key) for _, e in items]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            result[key] = sum(values)
    if isinstance(result.get("unexpected_count"), int) and result.get("element_count"):
        counted = result["element_count"] - int(result.get("missing_count") or 0)
        unexpected = result["unexpected_count"]
        result["unexpected_percent"] = 100.0 * unexpected / counted if counted else 0.0
    for key in _PARTIAL_LISTS:
        if key in result:
            joined = [v for _, e in failing for v in (e.get("result") or {}).get(key) or []]
            result[key] = joined[:_PARTIAL_MAX]
    if "partial_unexpected_counts" in result:  # [{"value", "count"}] summed by value
        totals: dict[str, dict[str, Any]] = {}
        for _, e in failing:
            for item in (e.get("result") or {}).get("partial_unexpected_counts") or []:
                key = json.dumps(item.get("value"), sort_keys=True, default=str)
                entry = totals.setdefault(key, {"value": item.get("value"), "count": 0})
                entry["count"] += int(item.get("count") or 0)
        result["partial_unexpected_counts"] = sorted(
            totals.values(), key=lambda item: -item["count"]
        )[:_PARTIAL_MAX]
    base.update(
        success=not failing,
        errored=any(e.get("errored") for _, e in items),
        shards_failed=[shard_id for shard_id, _ in failing],
        result=result,
    )
    return base
