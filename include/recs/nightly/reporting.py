"""Run summaries assembled from the manifests each stage writes (no recomputation), and what
the run store holds of the run, from its markers."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from recs.errors import RecsError
from recs.files import read_json
from recs.nightly import artifacts
from recs.nightly.locks import in_progress
from recs.nightly.parts import GRAPH, SNAPSHOT, SNAPSHOT_MANIFEST, VALIDATION, shard_part
from recs.nightly.runs import RunPaths
from recs.published import MANIFEST_FILE, current_version, version_dir


def run_summary(home: Path, snapshot_date: str | dt.date, run_id: str | None = None) -> dict:
    """Totals and per-shard figures of one run.

    Returns ``{"run_id", "snapshot_date", "totals": {...}, "shards": [shard manifest, ...],
    "failed_shards": [shard id, ...], "validation": {...} | None}``. Totals, keyed for programs
    (``total_lines`` gives the labels ``recs summary`` prints): ``snapshot_rows`` ({table:
    rows}); ``shards_done`` of ``shard_count`` (the others, ``failed_shards``, have no
    manifest: failed, or never run, as in a run stopped by Ctrl-C; carried over if published
    so); ``eligible_users`` (the snapshot's shard plan, which the gate holds equal to dbt's
    count; else the computed shards') and ``eligible_users_in_computed_shards``; in the
    computed shards ``users_with_recommendations``, ``recommendation_rows``, ``traversals``
    (second-hop expansions counted), ``shard_seconds`` (summed) and the rates
    ``traversals_per_shard_second`` and ``traversals_per_kernel_second``; the gate's outcome
    ``validation`` ("passed", "failed", "errored", "nothing_to_validate", "not_run") and
    ``validation_stale`` (a shard computed after it); ``stopped_at``, the stage the last
    ``recs run`` of the run raised in and its error (``{"stage", "error"}``, else None; a DAG
    run's failures are Airflow's to show); ``run_store``, what the run store holds complete of
    the run (``_run_store_view``; None without one); ``published``, one of
    ``PUBLICATION_STATES``, and ``published_detail``, the same in words; ``in_progress``, whether
    a process holds the run's lock now (``locks.in_progress``: a rerun or a stage; None when its
    lock file cannot be read). (A newcomer read
    "eligible users 29,562" of a run with two of four shards computed: half the 58,901 the gate
    reported.) Raises ``RunNotFoundError`` if the run has no snapshot.
    """
    paths = RunPaths.find(home, snapshot_date, run_id)
    snapshot = read_json(paths.snapshot_manifest)
    shard_count = _planned_shards(snapshot)
    shards: list[dict[str, Any]] = []
    for shard_id in range(shard_count):
        if paths.shard_manifest(shard_id).is_file():
            shards.append(read_json(paths.shard_manifest(shard_id)))
    done = {int(s.get("shard_id", -1)) for s in shards}
    failed = [shard_id for shard_id in range(shard_count) if shard_id not in done]
    validation_file = paths.validation_summary
    validation = read_json(validation_file) if validation_file.exists() else None
    counts = snapshot.get("row_counts", snapshot.get("counts", {}))
    shard_seconds = sum(float(s.get("seconds", 0.0)) for s in shards)
    kernel_seconds = sum(float(s.get("kernel_seconds") or 0.0) for s in shards)
    traversals = sum(int(s.get("traversals", 0)) for s in shards)
    in_computed = sum(int(s.get("users_in", 0)) for s in shards)
    planned = (snapshot.get("shard_plan") or {}).get("eligible_users")
    totals: dict[str, Any] = {
        "snapshot_rows": {name: value for name, value in counts.items() if isinstance(value, int)},
        "shards_done": len(shards),
        "shard_count": shard_count,
        "eligible_users": planned if isinstance(planned, int) else in_computed,
        "eligible_users_in_computed_shards": in_computed,
        "users_with_recommendations": sum(
            int(s.get("users_with_recommendations", 0)) for s in shards
        ),
        "recommendation_rows": sum(int(s.get("rows", 0)) for s in shards),
        "traversals": traversals,
        "shard_seconds": round(shard_seconds, 3),
        # each shard's own timer, from reading its inputs to writing its output (a fresh
        # machine's first also compiles the kernel; Airflow's task time adds the task's start
        # and the run store's sync, a newcomer read 21.5 s against these 19.5), and the compiled
        # kernel's alone, its compiling left out (a newcomer's demo read 3.1 M/s, one shard's
        # 6.3 s of compiling in it): the rate `make bench` measures
        "traversals_per_shard_second": per_second(traversals, shard_seconds),
        "traversals_per_kernel_second": per_second(traversals, kernel_seconds),
        "validation": _outcome(validation),
        "validation_stale": verdict_stale(paths, shard_count),
        "stopped_at": _stopped_at(paths),
        "run_store": _run_store_view(paths),
    }
    totals["published"], totals["published_detail"] = _publication(home, paths)
    # a newcomer read a rerun's figures mid-way as its result: they are the last attempt's
    try:
        totals["in_progress"] = in_progress(paths.run_dir)
    except OSError:  # a lock file it may not read: cannot tell
        totals["in_progress"] = None
    return {
        "run_id": paths.run_id,
        "snapshot_date": paths.snapshot_date.isoformat(),
        "totals": totals,
        "shards": shards,
        "failed_shards": failed,
        "validation": validation,
    }


def per_second(count: int, seconds: float) -> int | float:
    """``count / seconds`` for people: whole (rounded) from 100 up, else to three significant
    digits (a newcomer's 15 traversals in 16.6 s read 0, not 0.904); 0 without seconds."""
    if not seconds:
        return 0
    rate = count / seconds
    return round(rate) if rate >= 99.95 else float(f"{rate:.3g}")


PUBLICATION_STATES = (
    "no", "removed", "other_snapshot", "damaged", "served", "current_unset", "beside_current"
)  # fmt: skip
"""``totals["published"]`` of ``run_summary``: not published; published once, its version
removed since (by ``recs gc``'s version retention, or by hand); a version of this run id of
another snapshot; published but not servable; published and named by ``CURRENT``; published
while ``CURRENT`` names none; published beside the ``CURRENT`` version."""


def _publication(home: Path, paths: RunPaths) -> tuple[str, str]:
    """Whether the run is published and served: one of ``PUBLICATION_STATES`` and the same in
    words. (A newcomer's `make demo` published beside a later snapshot's version left by
    earlier CLI runs; only the DAG's log said so, and `recs recommend` served the other
    version.) A version that cannot be served (damaged, incomplete, not validated:
    ``publish.check_servable``) says so instead of a remedy that would be refused."""
    from recs.nightly.publish import check_servable

    published_dir = Path(home) / "published"
    if not version_dir(published_dir, paths.run_id).is_dir():
        return _removed(published_dir, paths) or ("no", "no")
    problem = None
    try:
        manifest = check_servable(published_dir, paths.run_id)  # reads the manifest once
    except (RecsError, OSError) as error:
        problem = error
        try:  # which snapshot it is of, if that can be read
            manifest = read_json(version_dir(published_dir, paths.run_id) / MANIFEST_FILE)
        except (RecsError, OSError):
            manifest = {"snapshot_date": paths.snapshot_date.isoformat()}
    date = manifest.get("snapshot_date")
    if date != paths.snapshot_date.isoformat():
        return "other_snapshot", f"no (the published {paths.run_id} is of another snapshot: {date})"
    current = current_version(published_dir, strict=False)
    if problem is not None:
        named = " CURRENT names it, but" if current == paths.run_id else ""
        return "damaged", f"damaged:{named} it cannot be served ({problem})"
    if current == paths.run_id:
        return "served", "yes, and CURRENT names it (served)"
    if current is None:
        return "current_unset", "yes, but CURRENT names no version (`recs runs` says why)"
    return "beside_current", (
        f"yes, beside CURRENT {current}, which is served: `recs rollback --to {paths.run_id}`"
    )


def removed_since(
    published_dir: Path, run_id: str, snapshot_date: str, events: list[dict] | None = None
) -> str | None:
    """When ``run_id`` of ``snapshot_date`` (ISO) was last published (the history's ``at``:
    ``history.events``, or ``events`` already read from it; an event without a date, written
    before dates were recorded, is taken as of any date) if its version is gone since (by ``recs
    gc``'s version retention, or by hand), else None (never published, or its folder is there;
    a run id reused for another date once the version was removed is not the published one). (A
    newcomer read "published: no" of a run that had been served for a week, after ``recs gc``
    kept only the newest versions.)"""
    if version_dir(published_dir, run_id).is_dir():
        return None
    if events is None:
        events = history_events(published_dir)
    published = [
        e for e in events
        if e["run_id"] == run_id and e.get("action") == "publish"
        and e.get("snapshot_date", snapshot_date) == snapshot_date
    ]  # fmt: skip
    return str(published[-1].get("at")) if published else None


def history_events(published_dir: Path) -> list[dict]:
    """``history.events``, or none when it cannot be read (a folder in its place: what the
    summary and the report say of publishing stays "no")."""
    from recs.nightly import history

    try:
        return history.events(published_dir)
    except OSError:
        return []


def removed_words(at: str) -> str:
    """What the summary and the report say of a run published at ``at`` (``removed_since``)
    whose version is gone since."""
    return (
        f"no longer: published at {at}, its version has been removed since "
        "(`recs gc` keeps the RECS_PUBLISHED_RETENTION_VERSIONS most recently used)"
    )


def _removed(published_dir: Path, paths: RunPaths) -> tuple[str, str] | None:
    """``("removed", words)`` when ``removed_since`` says when, else None."""
    at = removed_since(published_dir, paths.run_id, paths.snapshot_date.isoformat())
    return None if at is None else ("removed", removed_words(at))


def _planned_shards(snapshot: dict[str, Any]) -> int:
    """The shard count a snapshot manifest plans (its own, else its frozen settings')."""
    return int(snapshot.get("shard_count") or snapshot["settings"]["shard_count"])


def _run_store_view(paths: RunPaths) -> dict[str, Any] | None:
    """What the run store holds complete of the run (markers it trusts, ``RunStore.markers``),
    read in four requests at most: ``{"url", "shard_count", "shards_done", "graph",
    "validation"}`` (the store's shard plan, from its snapshot manifest; ``graph``: whether the
    graph is complete there; ``validation``: the outcome of its verdict, as ``_outcome``),
    ``{"url", "shard_count": None}`` when it holds no snapshot of the run, ``{"url", "error"}``
    when it cannot be read, None without a run store. The other totals are this machine's
    copies, which change only as its next stage pulls (a review's second machine still showed
    the shards a rerun had withdrawn from the store)."""
    store = None
    try:
        store = artifacts.run_store()
        if store is None:
            return None
        held = set(store.names(paths, artifacts.MARKERS))
        manifest = store.read(paths, SNAPSHOT_MANIFEST[0])
        if f"{SNAPSHOT.name}.json" not in held or manifest is None:
            return {"url": store.url, "shard_count": None}
        shard_count = _planned_shards(json.loads(manifest))
        parts = [*(shard_part(i) for i in range(shard_count)), GRAPH, VALIDATION]
        markers = store.markers(paths, [part for part in parts if f"{part.name}.json" in held])
        verdict = None
        if markers.get(VALIDATION.name):
            summary = paths.validation_summary.relative_to(paths.run_dir).as_posix()
            verdict = store.read(paths, summary)
        validation = _outcome(json.loads(verdict) if verdict is not None else None)
    except RecsError as error:  # a malformed URL, a store away: the local totals still stand
        return {"url": getattr(store, "url", None), "error": str(error)}
    except (ValueError, KeyError, TypeError, AttributeError) as error:  # not ours, or damaged
        problem = f"a damaged snapshot manifest or verdict ({type(error).__name__}: {error})"
        return {"url": store.url, "error": problem}
    return {
        "url": store.url,
        "shard_count": shard_count,
        "shards_done": sum(markers.get(shard_part(i).name) is not None for i in range(shard_count)),
        "graph": markers.get(GRAPH.name) is not None,
        "validation": validation,
    }


def verdict_stale(paths: RunPaths, shard_count: int) -> bool:
    """Whether a shard's output (its manifest, written last) is newer than the gate's verdict
    (``paths.validation_summary``): a shard rerun since the gate, which ``recs validate``
    judges. (A newcomer's rerun, stopped before its gate, showed 4 of 4 shards beside the
    earlier "nothing to validate"; another's report said "passed" of a shard rerun since.) A
    byte-for-byte rerun is stale too: the gate judges the manifest as well as the output, and
    comparing the output's sha256 alone missed a manifest replaced since (a review's)."""
    try:
        judged = paths.validation_summary.stat().st_mtime
    except OSError:
        return False
    for shard_id in range(shard_count):
        try:
            if paths.shard_manifest(shard_id).stat().st_mtime > judged:
                return True
        except OSError:
            continue
    return False


def stopped_at(stage_times: dict[str, Any] | None) -> dict[str, str] | None:
    """The stage the last ``recs run`` raised in, ``{"stage", "error"}``, from the document of
    ``RunPaths.stage_times`` as ``pipeline._record_stop`` saved it; None if none did, or the
    document or its entry is missing or damaged (the one reading of it: the summary, the
    report and ``pipeline._amend_times``)."""
    stopped = (stage_times or {}).get("stopped_at")
    return stopped if isinstance(stopped, dict) and "stage" in stopped else None


def _stopped_at(paths: RunPaths) -> dict[str, str] | None:
    """``stopped_at`` of the run's ``paths.stage_times``; None if it cannot be read."""
    try:
        return stopped_at(read_json(paths.stage_times))
    except (RecsError, OSError):
        return None


def _outcome(validation: dict[str, Any] | None) -> str:
    """The gate's outcome: its summary's ``outcome`` (``passed``, ``failed``, ``errored``,
    ``nothing_to_validate``), or ``not_run`` without one."""
    if validation is None:
        return "not_run"
    default = "passed" if validation.get("success") else "failed"
    return str(validation.get("outcome", default))


def total_lines(summary: dict[str, Any]) -> dict[str, Any]:
    """``run_summary``'s totals as ``recs summary`` prints them: {label: value}, in order."""
    totals = summary["totals"]
    lines: dict[str, Any] = {
        f"snapshot {name}": value for name, value in totals["snapshot_rows"].items()
    }
    not_computed = ", ".join(f"{i:03d}" for i in summary["failed_shards"])
    stale = " (stale: shards were computed since; `recs validate` judges them)"
    lines.update(
        {
            **(
                {"last recs run": f"stopped at {stopped['stage']}: {stopped.get('error', '?')}"}
                if (stopped := totals.get("stopped_at"))
                else {}
            ),
            "shards done": f"{totals['shards_done']} of {totals['shard_count']}",
            "shards not computed": not_computed or "none",
            "eligible users": totals["eligible_users"],
            "eligible users in computed shards": totals["eligible_users_in_computed_shards"],
            "users with recommendations": totals["users_with_recommendations"],
            "recommendation rows": totals["recommendation_rows"],
            "traversals": totals["traversals"],
            "shard seconds (sum)": totals["shard_seconds"],
            "traversals per shard second (compile included)": totals[
                "traversals_per_shard_second"
            ],
            "traversals per kernel second (compile excluded)": totals[
                "traversals_per_kernel_second"
            ],
            "validation": totals["validation"].replace("_", " ")
            + (stale if totals["validation_stale"] else ""),
            "published": totals["published_detail"],
            **_run_store_line(totals),
            "in progress": {
                True: "yes: another process is working on this run, so these figures may be an "
                "earlier attempt's",
                False: "no",
                None: "unknown (its lock file cannot be read)",
            }[totals["in_progress"]],
        }
    )
    return lines


def _run_store_line(totals: dict[str, Any]) -> dict[str, str]:
    """``total_lines``' "run store" line, when one is set: what it holds complete, and whether
    this machine's copies (the lines above) differ from it."""
    view = totals.get("run_store")
    if not view:
        return {}
    if "error" in view:
        return {"run store": f"cannot be read: {view['error']}"}
    if view["shard_count"] is None:
        return {"run store": "holds no snapshot of this run"}
    held = (
        f"shards done {view['shards_done']} of {view['shard_count']}, graph "
        f"{'complete' if view['graph'] else 'not complete'}, validation "
        f"{view['validation'].replace('_', ' ')}"
    )
    here = (totals["shards_done"], totals["shard_count"], totals["validation"])
    if here != (view["shards_done"], view["shard_count"], view["validation"]):
        held += " (this machine's copies above differ: they change as its next stage pulls)"
    return {"run store": held}
