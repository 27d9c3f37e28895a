"""One run's report, assembled from the files its stages wrote (nothing is recomputed).

Sources, all under ``runs/<date>/<run_id>/`` unless said: ``snapshot/manifest.json`` (the frozen
settings, the shard count), ``shards/shard_id=NNN/manifest.json`` (users, rows, traversals,
``hub_traversals``, seconds, ``peak_rss_mb``), ``validation/summary.json`` and
``results.json`` (the gate), ``dbt/target/run_results.json`` (each dbt node's status), and the
run's published version's ``manifest.json`` (per-shard ``status`` / ``carried_from``). Stage
timings come from Airflow's task instances when the caller passes them (the plugin does),
else from the run's own files. Every section is present even when its files are not (a run
that stopped early): missing figures are None, never guessed. The skew rule is
``SKEW_FACTOR`` × the median traversals of the computed shards (the design's rebalance trigger).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from pathlib import Path
from typing import Any

from recs.errors import RunNotFoundError
from recs.nightly.reporting import history_events, removed_since, stopped_at, verdict_stale
from recs.nightly.runs import (
    DBT_RUN_RESULTS,
    RunPaths,
    check_run_id,
    parse_snapshot_date,
    run_id_from_airflow,
)
from recs.published import MANIFEST_FILE, current_version, version_dir

STAGES = (
    "freeze_snapshot",
    "build_models",
    "plan_graph",
    "cap_graph",
    "build_graph",
    "plan_shards",
    "plan_gate",
    "traverse_shard",
    "validate_shards",
    "validate_run",
    "publish_run",
)
# a task per group of partitions / shard / group of shards
MAPPED_STAGES = ("cap_graph", "traverse_shard", "validate_shards")
SKEW_FACTOR = 2.0
COMPUTED, CARRIED_OVER, FAILED, NOT_RUN = "computed", "carried_over", "failed", "not run"
DBT_FAILED = ("error", "fail", "runtime error")
DBT_OK = ("success", "pass", "no-op")  # an exposure's build result is "no-op"
DBT_RESULTS = DBT_RUN_RESULTS  # relative to the run folder, for the web view
DBT_LOG = Path("dbt") / "logs" / "dbt.log"
DBT_DOCS = Path("dbt") / "docs" / "static_index.html"
DATA_DOCS = Path("validation") / "data_docs" / "index.html"


def find_run(home: Path, run_id: str, snapshot_date: str | dt.date | None = None) -> RunPaths:
    """The run folder of ``run_id`` (an Airflow run id is mapped with ``run_id_from_airflow``).

    With ``snapshot_date`` that date's folder; without, the one date folder holding the run
    (the newest if several do). Raises ``RunNotFoundError`` (or ``InvalidRunIdError``).
    """
    name = check_run_id(run_id_from_airflow(run_id))
    runs_dir = Path(home) / "runs"
    if snapshot_date is not None:
        day = parse_snapshot_date(snapshot_date)
        paths = RunPaths(Path(home), day, name)
        if paths.run_dir.is_dir():
            return paths
    found = sorted(p.parent.name for p in runs_dir.glob(f"*/{name}") if p.is_dir())
    if not found:
        raise RunNotFoundError(f"no run {name!r} under {runs_dir}")
    return RunPaths(Path(home), parse_snapshot_date(found[-1]), name)


def list_runs(home: Path, limit: int = 30) -> list[dict[str, Any]]:
    """The newest ``limit`` run folders: ``[{"run_id", "snapshot_date", "outcome", "rows",
    "users", "published", "removed_since"}]`` (``removed_since``: ``reporting.removed_since``),
    newest date first (then by last change)."""
    home = Path(home)
    published = home / "published"
    folders = [p for p in (home / "runs").glob("*/*") if p.is_dir() and not p.name.startswith(".")]
    folders.sort(key=lambda p: (p.parent.name, p.stat().st_mtime), reverse=True)
    events = history_events(published)  # once, not once per run
    runs = []
    for folder in folders[:limit]:
        summary = _read(folder / "validation" / "summary.json") or {}
        runs.append(
            {
                "run_id": folder.name,
                "snapshot_date": folder.parent.name,
                "outcome": summary.get("outcome", "not validated"),
                "rows": summary.get("rows"),
                "users": summary.get("users"),
                "published": (published / folder.name / MANIFEST_FILE).is_file(),
                "removed_since": removed_since(
                    published, folder.name, folder.parent.name, events
                ),
            }
        )
    return runs


def run_report(
    paths: RunPaths,
    task_instances: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Everything the run view shows, as one JSON-able dict.

    ``task_instances``: Airflow's, ``[{"task_id", "map_index", "state", "start_date",
    "end_date", "duration", "try_number"}]`` (ISO strings, seconds). Returns ``{"damaged", "run",
    "stages", "shards", "skew", "gate", "volume", "hubs", "dbt", "files"}``, each described at
    its function below; ``gate`` also says whether a shard was computed since the verdict
    (``stale``: ``reporting.verdict_stale``, as ``recs summary`` says it).
    """
    snapshot = _read(paths.snapshot_manifest) or {}
    settings = snapshot.get("settings") or {}
    shard_count = snapshot.get("shard_count") or settings.get("shard_count")
    published_dir = paths.home / "published"
    version = _read(version_dir(published_dir, paths.run_id) / MANIFEST_FILE)
    if version is not None and version.get("snapshot_date") != paths.snapshot_date.isoformat():
        version = None  # the same run id of another date was published, not this run
    summary = _read(paths.validation_summary)
    results = _read(paths.validation_results)
    shards = shard_rows(paths, shard_count, version, task_instances)
    damaged = damaged_files(paths, shard_count)
    outcome = (summary or {}).get("outcome", "not validated")
    if summary is None and paths.validation_summary.exists():
        outcome = "unreadable"
    return {
        "damaged": damaged,
        "run": {
            "run_id": paths.run_id,
            "snapshot_date": paths.snapshot_date.isoformat(),
            "run_dir": str(paths.run_dir),
            "shard_count": shard_count,
            "outcome": outcome,
            "published": version is not None,
            "is_current": version is not None
            and current_version(published_dir, strict=False) == paths.run_id,
            # published once, its version gone since (gc): not "not published"
            "removed_since": removed_since(
                published_dir, paths.run_id, paths.snapshot_date.isoformat()
            ),
            "rows": (version or summary or {}).get("rows"),
            "users": (version or summary or {}).get("users"),
        },
        "stages": stage_timings(paths, task_instances, shards),
        "shards": shards,
        "skew": skew(shards),
        "gate": {**gate(summary, results), "stale": verdict_stale(paths, shard_count)},
        "volume": volume(summary, settings),
        "hubs": hub_traffic(shards),
        "dbt": dbt_results(paths),
        "files": {
            "run_dir": str(paths.run_dir),
            "results": _if_file(paths.validation_results),
            "summary": _if_file(paths.validation_summary),
            "data_docs": _if_file(paths.run_dir / DATA_DOCS),
            "dbt_run_results": _if_file(paths.dbt_run_results),
            "dbt_log": _if_file(paths.run_dir / DBT_LOG),
            "dbt_docs": _if_file(paths.run_dir / DBT_DOCS),
            "stage_times": _if_file(paths.stage_times),  # recorded by `recs run` only
        },
    }


def shard_rows(
    paths: RunPaths,
    shard_count: int | None,
    version: dict[str, Any] | None,
    task_instances: list[dict[str, Any]] | None,
) -> list[dict[str, Any]]:
    """One row per planned shard: ``shard_id, status, carried_from, users_in,
    users_with_recommendations, rows, traversals, hub_traversals, hub_share, seconds,
    kernel_seconds, peak_rss_mb, task_state, tries``.

    ``status``: ``computed`` (its manifest is there), ``carried_over`` (the published version
    took its rows from ``carried_from``), ``failed`` (neither, and the run was validated or its
    task failed) or ``not run``. The published version's word wins over the files (a shard
    rerun after the publish does not rewrite what readers are served).
    """
    if not shard_count:
        return []
    published = {int(s["shard_id"]): s for s in (version or {}).get("shards", [])}
    tis = {
        int(ti["map_index"]): ti
        for ti in task_instances or []
        if ti.get("task_id") == "traverse_shard" and _map_index(ti) >= 0
    }
    validated = paths.validation_summary.is_file()
    rows = []
    for shard_id in range(int(shard_count)):
        manifest = _read(paths.shard_manifest(shard_id)) or {}
        entry = published.get(shard_id, {})
        ti = tis.get(shard_id, {})
        if entry.get("status") == CARRIED_OVER:
            status = CARRIED_OVER
        elif manifest:
            status = COMPUTED
        elif validated or ti.get("state") in ("failed", "upstream_failed"):
            status = FAILED
        else:
            status = NOT_RUN
        traversals = manifest.get("traversals")
        hubs = manifest.get("hub_traversals")
        rows.append(
            {
                "shard_id": shard_id,
                "status": status,
                "carried_from": entry.get("carried_from"),
                "users_in": manifest.get("users_in"),
                "users_with_recommendations": manifest.get(
                    "users_with_recommendations", entry.get("users")
                ),
                "rows": manifest.get("rows", entry.get("rows")),
                "traversals": traversals,
                "hub_traversals": hubs,
                "hub_share": hubs / traversals if traversals and hubs is not None else None,
                "seconds": manifest.get("seconds"),
                "kernel_seconds": manifest.get("kernel_seconds"),
                "peak_rss_mb": manifest.get("peak_rss_mb"),
                "task_state": ti.get("state"),
                "tries": ti.get("try_number"),
            }
        )
    return rows


def skew(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """The rebalance trigger: ``{"median_traversals", "factor", "threshold", "flagged": [shard
    ids whose traversals exceed factor × median], "max_ratio"}`` over the computed shards
    (None figures when none was computed). Each shard row gains ``cost_ratio`` and ``skewed``."""
    costs = [s["traversals"] for s in shards if isinstance(s.get("traversals"), int)]
    median = statistics.median(costs) if costs else None
    threshold = SKEW_FACTOR * median if median is not None else None
    for shard in shards:
        cost = shard.get("traversals")
        ratio = cost / median if isinstance(cost, int) and median else None
        shard["cost_ratio"] = ratio
        shard["skewed"] = bool(threshold is not None and isinstance(cost, int) and cost > threshold)
    return {
        "median_traversals": median,
        "factor": SKEW_FACTOR,
        "threshold": threshold,
        "flagged": [s["shard_id"] for s in shards if s["skewed"]],
        "max_ratio": max((s["cost_ratio"] for s in shards if s["cost_ratio"]), default=None),
    }


def stage_timings(
    paths: RunPaths,
    task_instances: list[dict[str, Any]] | None,
    shards: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """One row per stage in ``STAGES`` order: ``stage, state, seconds, start, end, offset,
    tries, mapped, source``. From Airflow (``source: "airflow"``): the mapped
    ``traverse_shard`` spans its first start to its last end, ``state`` the worst of its
    tasks; ``offset`` is seconds after the run's first start. From the run's files
    (``source: "files"``, no start or end): the wall seconds ``recs run`` recorded per stage
    (``RunPaths.stage_times``, amended by a stage run alone), else dbt's elapsed time for
    ``build_models`` and the sum of the shard seconds for ``traverse_shard``; a stage with
    neither has None; the stage that last ``recs run`` raised in has state ``failed`` and no
    seconds."""
    if task_instances:
        return _airflow_stages(task_instances)
    dbt = _read(paths.dbt_run_results) or {}
    shard_seconds = [s["seconds"] for s in shards if isinstance(s.get("seconds"), int | float)]
    seconds: dict[str, float | None] = {
        "build_models": dbt.get("elapsed_time"),
        "traverse_shard": round(sum(shard_seconds), 3) if shard_seconds else None,
    }
    times = _read(paths.stage_times) or {}
    recorded = times.get("stages")
    if isinstance(recorded, dict):
        seconds.update(
            {name: value for name, value in recorded.items() if isinstance(value, int | float)}
        )
    stopped = (stopped_at(times) or {}).get("stage")  # the last `recs run` raised there
    return [
        {"stage": stage, "state": "failed" if stage == stopped else None,
         "seconds": None if stage == stopped else seconds.get(stage), "start": None,
         "end": None, "offset": None, "tries": None, "mapped": stage in MAPPED_STAGES,
         "source": "files"}
        for stage in STAGES
    ]  # fmt: skip


def _airflow_stages(task_instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_task: dict[str, list[dict[str, Any]]] = {}
    for ti in task_instances:
        by_task.setdefault(ti["task_id"], []).append(ti)
    starts = [_time(ti.get("start_date")) for ti in task_instances]
    first = min((t for t in starts if t is not None), default=None)
    rows = []
    order = list(STAGES) + sorted(set(by_task) - set(STAGES))
    for stage in order:
        tis = by_task.get(stage, [])
        begins = [t for t in (_time(ti.get("start_date")) for ti in tis) if t is not None]
        ends = [t for t in (_time(ti.get("end_date")) for ti in tis) if t is not None]
        start, end = (min(begins) if begins else None), (max(ends) if ends else None)
        rows.append(
            {
                "stage": stage,
                "state": _worst([str(ti.get("state")) for ti in tis]) if tis else "no task",
                "seconds": round((end - start).total_seconds(), 3) if start and end else None,
                "start": start.isoformat() if start else None,
                "end": end.isoformat() if end else None,
                "offset": round((start - first).total_seconds(), 3) if start and first else None,
                "tries": max((ti.get("try_number") or 0 for ti in tis), default=None),
                "mapped": any(_map_index(ti) >= 0 for ti in tis),
                "source": "airflow",
            }
        )
    return rows


_STATE_ORDER = ("failed", "upstream_failed", "up_for_retry", "running", "queued", "scheduled",
                "skipped", "success")  # fmt: skip


def _worst(states: list[str]) -> str:
    for state in _STATE_ORDER:
        if state in states:
            return state
    return states[0] if states else "none"


def gate(summary: dict[str, Any] | None, results: dict[str, Any] | None) -> dict[str, Any]:
    """The gate's verdict: ``{"outcome", "error", "evaluated", "passed", "failed", "errored",
    "skipped": [{"name", "reason"}], "compared_with", "checkpoints": [{"name", "batch", "rows",
    "success", "error", "expectations": [{"name", "expectation_type", "column", "success",
    "errored", "unexpected_count", "element_count", "exception", "status"}]}]}``; ``status``
    is ``passed``, ``failed`` or ``errored``. ``outcome`` ``not validated`` without files."""
    summary = summary or {}
    checkpoints = []
    for checkpoint in (results or {}).get("checkpoints", []):
        expectations = []
        for item in checkpoint.get("expectations", []):
            result = item.get("result") or {}
            errored = bool(item.get("errored"))
            status = "errored" if errored else "passed" if item.get("success") else "failed"
            expectations.append(
                {
                    "name": item.get("name"),
                    "expectation_type": item.get("expectation_type"),
                    "column": (item.get("kwargs") or {}).get("column"),
                    "success": bool(item.get("success")),
                    "errored": errored,
                    "unexpected_count": result.get("unexpected_count"),
                    "element_count": result.get("element_count"),
                    "exception": item.get("exception"),
                    "status": status,
                }
            )
        checkpoints.append(
            {
                "name": checkpoint.get("name"),
                "batch": checkpoint.get("batch"),
                "rows": checkpoint.get("rows"),
                "success": bool(checkpoint.get("success")),
                "error": checkpoint.get("error"),
                "expectations": expectations,
            }
        )
    every = [e for c in checkpoints for e in c["expectations"]]
    return {
        "outcome": summary.get("outcome", "not validated"),
        "error": summary.get("error"),
        "evaluated": len(every),
        "passed": sum(e["status"] == "passed" for e in every),
        "failed": sum(e["status"] == "failed" for e in every),
        "errored": sum(e["status"] == "errored" for e in every),
        "skipped": list(summary.get("skipped") or (results or {}).get("skipped") or []),
        "compared_with": summary.get("compared_with"),
        "checkpoints": checkpoints,
    }


def volume(summary: dict[str, Any] | None, settings: dict[str, Any]) -> dict[str, Any]:
    """Users with lists and rows against the version the gate compared with: ``{"compared_with",
    "max_drop", "max_growth", "measures": [{"measure", "tonight", "replaced", "change",
    "within_bounds"}]}`` (``change`` relative, e.g. -0.1; None when nothing was compared)."""
    summary = summary or {}
    drop, growth = settings.get("gate_max_drop"), settings.get("gate_max_growth")
    measures = []
    for measure, tonight_key, replaced_key in (
        ("users with lists", "users", "replaced_users"),
        ("rows", "rows", "replaced_rows"),
    ):
        tonight, replaced = summary.get(tonight_key), summary.get(replaced_key)
        change = tonight / replaced - 1.0 if tonight is not None and replaced else None
        within = None
        if change is not None and drop is not None and growth is not None:
            within = -drop <= change <= growth
        measures.append({"measure": measure, "tonight": tonight, "replaced": replaced,
                         "change": change, "within_bounds": within})  # fmt: skip
    return {
        "compared_with": summary.get("compared_with"),
        "max_drop": drop,
        "max_growth": growth,
        "measures": measures,
    }


def hub_traffic(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """Second-hop expansions through hub accounts: ``{"hub_traversals", "traversals",
    "share"}`` summed over the computed shards (None when no shard recorded them)."""
    measured = [s for s in shards if isinstance(s.get("hub_traversals"), int)]
    hubs = sum(s["hub_traversals"] for s in measured)
    total = sum(s["traversals"] or 0 for s in measured)
    return {
        "hub_traversals": hubs if measured else None,
        "traversals": total if measured else None,
        "share": hubs / total if measured and total else None,
    }


def dbt_results(paths: RunPaths) -> dict[str, Any]:
    """dbt's ``run_results.json`` of the run's build: ``{"available", "elapsed_time", "counts":
    {resource type: {status: n}}, "problems": [{"unique_id", "resource_type", "status",
    "message", "failures"}] (every node not in ``DBT_OK``: failed first), "nodes": n}``."""
    document = _read(paths.dbt_run_results)
    unavailable = {"available": False, "elapsed_time": None, "counts": {}, "problems": [],
                   "nodes": 0}  # fmt: skip
    if document is None or not isinstance(document.get("results", []), list):
        return unavailable
    if not all(isinstance(result, dict) for result in document.get("results", [])):
        return unavailable
    counts: dict[str, dict[str, int]] = {}
    problems = []
    for result in document.get("results", []):
        unique_id = str(result.get("unique_id", ""))
        kind = unique_id.split(".", 1)[0] or "node"
        status = str(result.get("status"))
        counts.setdefault(kind, {}).setdefault(status, 0)
        counts[kind][status] += 1
        if status not in DBT_OK:
            problems.append(
                {
                    "unique_id": unique_id,
                    "resource_type": kind,
                    "status": status,
                    "message": " ".join(str(result.get("message") or "").split())[:500],
                    "failures": result.get("failures"),
                }
            )
    problems.sort(key=lambda p: (p["status"] not in DBT_FAILED, p["unique_id"]))
    return {
        "available": True,
        "elapsed_time": elapsed if isinstance(elapsed := document.get("elapsed_time"),
                                              (int, float)) else None,
        "counts": counts,
        "problems": problems,
        "nodes": len(document.get("results", [])),
    }


def _map_index(ti: dict[str, Any]) -> int:
    value = ti.get("map_index")
    return int(value) if value is not None else -1


def damaged_files(paths: RunPaths, shard_count: int | None) -> list[str]:
    """The run's JSON files the report reads that exist but are not a readable JSON object
    (truncated, edited): shown as a warning, so a damaged file is not taken for a missing one."""
    candidates = [
        paths.snapshot_manifest,
        version_dir(paths.home / "published", paths.run_id) / MANIFEST_FILE,
        paths.validation_summary,
        paths.validation_results,
        paths.dbt_run_results,
        *(paths.shard_manifest(i) for i in range(shard_count or 0)),
    ]
    return [str(p) for p in candidates if p.is_file() and _read(p) is None]


def _read(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _if_file(path: Path) -> str | None:
    return str(path) if path.is_file() else None


def _time(value: Any) -> dt.datetime | None:
    if not value:
        return None
    try:
        moment = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
