"""The nightly run as plain functions: each Airflow task and each CLI command calls one of these.

Stage order (ARCHITECTURE §2): ``freeze_snapshot`` → ``build_models`` → ``build_graph`` (in the
DAG: ``plan_graph`` → ``cap_graph`` × P → ``build_graph``, the assembly) → ``plan_shards`` →
``traverse_shard`` × S → ``validate_shards`` × G → ``validate_run`` → ``publish_run``.

Every stage takes a ``RunPaths`` (run-scoped folders; never "latest", never the wall clock),
writes only under it (``publish_run`` also under ``published/``), overwrites its own outputs on
rerun, and returns a small JSON-able dict (paths, counts, seconds) fit for XCom.

The settings a run uses are frozen into its snapshot manifest by ``freeze_snapshot``; later
stages read them back with ``run_settings`` so a retry, a single-shard rerun from the CLI or a
backfill computes with exactly the caps, weights and shard count the run started with.

With a run store (``RECS_RUN_STORE_URL``), each stage pulls what it reads from it first and
pushes what it wrote once it succeeded (``recs.nightly.artifacts.synced``), so the tasks of a run
may run on machines that share no disk; without one, ``synced`` does nothing.

A shard that fails does not stop the night: ``run_all`` (like the DAG, after its retries) goes
on to the gate, which validates the shards that were computed, and the publish carries the
failed ones over from the version being replaced (``recs.nightly.carryover``).
"""

from __future__ import annotations

import datetime as dt
import gc
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from recs.config import NOT_COMPUTED, Settings, get_settings
from recs.errors import RecsError, ValidationEngineError
from recs.files import read_json, write_json
from recs.nightly import point_in_time, shard_plan
from recs.nightly.artifacts import synced
from recs.nightly.locks import run_lock, shard_lock
from recs.nightly.reporting import stopped_at
from recs.nightly.runs import RunPaths, check_shard, naming_the_stage
from recs.nightly.withdrawal import withdraw_results, withdraw_shards
from recs.times import wall_clock

log = logging.getLogger(__name__)


def run_settings(paths: RunPaths) -> Settings:
    """The settings frozen into the run's snapshot manifest, with ``home`` the one the run is
    found under now (``paths.home``): what a run computes is frozen, where its home is is not
    (a home moved or mounted elsewhere published into the old path, which another machine or
    nothing held). Raises ``RunNotFoundError``."""
    manifest = read_json(paths.snapshot_manifest)
    return Settings.model_validate({**manifest["settings"], "home": str(paths.home)})


def settings_not_taken(paths: RunPaths, settings: Settings | None = None) -> dict[str, tuple]:
    """The settings set in this environment (``RECS_*``, ``settings.model_fields_set``) that a
    stage of the run does not take: ``{field: (value set, value frozen at the snapshot)}`` for
    each that differs, as validated (``0.5`` and ``.5`` are one value), from the run's frozen
    one (``run_settings``); connections, paths and ``config.NOT_COMPUTED`` are never
    listed. A newcomer set ``RECS_GATE_MIN_LIST_SHARE=0.99`` for `recs validate` and saw
    the run pass at 0.858 without a word. Raises ``RunNotFoundError``."""
    settings = settings or get_settings()
    frozen = read_json(paths.snapshot_manifest).get("settings") or {}
    taken = run_settings(paths).model_dump(mode="json")
    given = settings.model_dump(mode="json")
    return {
        name: (given[name], taken[name])
        for name in sorted(settings.model_fields_set - NOT_COMPUTED)
        if name in frozen and given.get(name) != taken.get(name)
    }


def freeze_snapshot(
    paths: RunPaths,
    settings: Settings | None = None,
    *,
    rebuild: bool = False,
    max_map_length: int | None = None,
) -> dict[str, Any]:
    """The run's snapshot as of its cut-off: the date's retained one, or the live store's
    (``recs.nightly.snapshot``); ``rebuild`` for a past date nothing is retained for; the
    shard plan checked against Airflow's ``max_map_length``; refused for a run id published for
    another date (``publish.refuse_taken_run_id``). Once it is frozen, what an earlier attempt
    of the run computed is withdrawn (``withdrawal.withdraw_results``); refused or failed before
    that, it leaves no run folder it made (``_locked_until_frozen``)."""
    from recs.nightly.publish import refuse_taken_run_id
    from recs.nightly.snapshot import freeze_snapshot as _freeze

    settings = settings or get_settings()
    with _locked_until_frozen(paths), synced(paths, "freeze_snapshot"):
        refuse_taken_run_id(Path(settings.published_dir), paths)  # before any work
        result = _freeze(paths, settings, rebuild=rebuild, max_map_length=max_map_length)
        withdraw_results(paths, result["shard_count"])
        return result


def build_models(paths: RunPaths) -> dict[str, Any]:
    """``dbt build`` over the snapshot into the run's DuckDB file and Parquet exports."""
    from recs.nightly.models import build_models as _build

    with run_lock(paths), synced(paths, "build_models"):
        return _build(paths, run_settings(paths))


def dbt_docs(paths: RunPaths) -> dict[str, Any]:
    """dbt's docs (lineage, catalog) of a built run into ``<run_dir>/dbt/docs/``
    (``recs.nightly.models.generate_docs``), under the run's lock: the catalog opens the
    run's DuckDB file, which no stage may be writing meanwhile."""
    from recs.nightly.models import generate_docs

    with run_lock(paths), synced(paths, "dbt_docs"):
        return generate_docs(paths, run_settings(paths))


def build_graph(paths: RunPaths) -> dict[str, Any]:
    """Build the run's capped, read-only CSR adjacency under ``paths.graph_dir`` in one process
    (``recs run``): the plan, every partition's piece and the assembly below, in turn."""
    from recs.traversal.graph import build_graph as _build

    with naming_the_stage(paths), run_lock(paths), synced(paths, "build_graph"):
        return _build(paths, run_settings(paths))


def plan_graph(paths: RunPaths) -> list[list[int]]:
    """The DAG's graph plan (``graph_pieces.plan_pieces``): the snapshot's partitions cut into
    the groups one ``cap_graph`` task each caps (``shard_plan.task_groups`` by the run's
    ``graph_partitions_per_task``). Reads every partition only when a hop order is
    ``reciprocity`` (the pairs followed back)."""
    from recs.traversal.graph_pieces import needs_reciprocity, plan_pieces

    with synced(paths, "plan_gate"):  # the snapshot manifest, from the run store if there is one
        settings = run_settings(paths)
    stage = "plan_graph_reciprocal" if needs_reciprocity(settings) else "plan_graph"
    with run_lock(paths), synced(paths, stage):
        plan = plan_pieces(paths, settings)
    return shard_plan.task_groups(plan["partitions"], settings.graph_partitions_per_task)


def cap_graph(paths: RunPaths, shard_ids: list[int]) -> list[dict[str, Any]]:
    """Cap the follows of partitions ``shard_ids`` into their graph pieces
    (``graph_pieces.cap_pieces``), each partition's lock held (the run's shared: the groups of
    one run are capped side by side), its inputs pulled and its piece pushed with a run store.
    """
    from recs.nightly.locks import graph_piece_lock
    from recs.traversal.graph_pieces import cap_pieces

    with synced(paths, "plan_gate"):  # the snapshot manifest (shard ids are checked on it)
        settings = run_settings(paths)
    for shard_id in shard_ids:
        check_shard(shard_id, settings.shard_count)
    with naming_the_stage(paths), ExitStack() as held:
        for shard_id in shard_ids:  # locks in the group's order, as every task takes them
            held.enter_context(graph_piece_lock(paths, shard_id))
            held.enter_context(synced(paths, "cap_graph", shard_id))
        return cap_pieces(paths, settings, shard_ids)


def assemble_graph(paths: RunPaths) -> dict[str, Any]:
    """The DAG's ``build_graph`` task: the run's graph assembled from the pieces the
    ``cap_graph`` tasks wrote (``graph.assemble_graph``; ``StalePieceError`` names any missing
    or stale)."""
    from recs.traversal.graph import assemble_graph as _assemble

    with naming_the_stage(paths), run_lock(paths), synced(paths, "assemble_graph"):
        return _assemble(paths, run_settings(paths))


def plan_shards(paths: RunPaths) -> list[int]:
    """The shard ids of this run: ``0 .. shard_count-1`` as frozen in the snapshot.

    Also makes the plan the truth (``withdrawal.withdraw_shards``, here and in the run store),
    so a rerun with fewer shards does not leave the old ones for the gate and the publish to
    find.
    """
    with synced(paths, "plan_shards"):
        shard_count = run_settings(paths).shard_count
        with run_lock(paths):
            withdraw_shards(paths, shard_count)
    return list(range(shard_count))


def traverse_shard(paths: RunPaths, shard_id: int) -> dict[str, Any]:
    """Capped two-hop traversal, pruning, scoring and top-k for one shard's eligible users.

    The shard's manifest is removed first: an attempt that fails leaves the shard *failed*
    (no manifest), never looking computed from an earlier attempt's files.
    """
    from recs.traversal import traverse_shard as _traverse

    with synced(paths, "plan_gate"):  # reads the manifest (from the run store), writes nothing
        check_shard(shard_id, run_settings(paths).shard_count)  # refused: no lock file left
    # The lock first: an attempt it refuses must not touch the run store (a synced stage
    # withdraws the marker of what it writes as it starts).
    with (
        naming_the_stage(paths),
        shard_lock(paths, shard_id),
        synced(paths, "traverse_shard", shard_id) as sync,
    ):
        settings = run_settings(paths)
        check_shard(shard_id, settings.shard_count)
        paths.shard_manifest(shard_id).unlink(missing_ok=True)
        return _traverse(paths, settings, shard_id, graph_dir=sync.graph_dir)


def gate_groups(paths: RunPaths, shard_ids: list[int]) -> list[list[int]]:
    """The groups of ``shard_ids`` one ``validate_shards`` task each checks
    (``shard_plan.task_groups`` by the run's ``gate_shards_per_task``)."""
    with synced(paths, "plan_gate"):  # the snapshot manifest, from the run store if there is one
        return shard_plan.task_groups(shard_ids, run_settings(paths).gate_shards_per_task)


def validate_shards(paths: RunPaths, shard_ids: list[int]) -> list[dict[str, Any]]:
    """The gate's checks of each of ``shard_ids`` in turn (``recs.nightly.shard_gate``: Great
    Expectations imported once for them all), each saved for ``validate_run``; never raises
    for what it finds (the verdict is the run's). Holds each shard's lock while it checks it,
    so it never reads a shard that ``traverse_shard`` is rewriting.

    The next shard is read ahead (``shard_gate.prepare_shard``, Polars, on a thread of its
    own) while GX judges the one before, single-threaded: two shards' locks and frames are
    held at once, never more (locks taken in the group's order, as every task takes them;
    the time it saves: ``bench/README.md``, "The night at scale")."""
    from recs.nightly.checkpoints import quiet_gx
    from recs.nightly.shard_gate import prepare_shard, validate_prepared

    with synced(paths, "validate_shards"):  # writes nothing: the snapshot manifest, if a store
        settings = run_settings(paths)
    for shard_id in shard_ids:  # every id of the group before any shard is checked
        check_shard(shard_id, settings.shard_count)
    quiet_gx()  # imported before the freeze below, so its modules' objects are frozen too
    results = []
    # GX's objects hold each shard's frames in reference cycles: collected after each shard,
    # the task holds one shard at a time and the next one read ahead (bench/README.md, "The
    # night at scale": at 1 M users the RSS grew 100-150 MB a shard without it; with it 16
    # shards peaked at 1,032 MB). What lived before the first shard (GX, pandas, ...) is
    # frozen out of those collections: 0.01 instead of 0.15 s a shard. A process that froze
    # objects itself (a worker that forks its tasks) keeps them frozen: gc.unfreeze would
    # release everything, not only ours.
    frozen_before = gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="recs-gate-read") as reader:

            def read_ahead(shard_id: int) -> tuple[ExitStack, Future]:
                held = ExitStack()  # the lock before the run store's sync, as in traverse_shard
                try:
                    held.enter_context(shard_lock(paths, shard_id))
                    held.enter_context(synced(paths, "validate_shard", shard_id))
                except BaseException:
                    held.close()
                    raise
                return held, reader.submit(prepare_shard, paths, settings, shard_id)

            ahead = read_ahead(shard_ids[0]) if shard_ids else None
            for next_id in [*shard_ids[1:], None]:
                held, prepared = ahead
                ahead = None
                with held:  # released (and the store's sync ended) once this shard is saved
                    try:
                        if next_id is not None:
                            ahead = read_ahead(next_id)
                        results.append(validate_prepared(paths, prepared.result()))
                    except BaseException:
                        if ahead is not None:  # the next shard ends as if it had failed too
                            ahead[1].cancel()
                            wait([ahead[1]])  # its read is over before its lock is let go
                            ahead[0].__exit__(*sys.exc_info())
                        raise
                gc.collect()
    finally:
        if not frozen_before:
            gc.unfreeze()
    return results


def validate_run(paths: RunPaths) -> dict[str, Any]:
    """The Great Expectations gate over the computed shards (their ``validate_shards`` results,
    or validated here when missing or stale, and the run-wide checks); raises
    ``ValidationFailedError`` (the data), ``ValidationEngineError`` (the gate itself; also,
    before the gate runs and with nothing written or pushed, on a machine whose ``published/``
    is not the served one: ``served.refuse_unseen``, as a newcomer's gate on a second machine
    pushed "errored" over the run store's pass) or ``NothingToValidateError``."""
    from recs.nightly.served import refuse_unseen
    from recs.nightly.validation import validate_run as _validate
    from recs.published import current_version

    with synced(paths, "plan_gate"):  # the snapshot manifest, from the run store if there is one
        published_dir = run_settings(paths).published_dir
    refuse_unseen(published_dir, current_version(published_dir), "validate_run",
                  ValidationEngineError, finishing=paths.run_id)  # fmt: skip
    with run_lock(paths), synced(paths, "validate_run"), _timed(paths, "validate_run"):
        return _validate(paths, run_settings(paths))


def publish_run(paths: RunPaths) -> dict[str, Any]:
    """Write ``published/<run_id>/`` (failed shards carried over) and point ``CURRENT`` at it."""
    from recs.nightly.publish import publish_run as _publish

    with run_lock(paths), synced(paths, "publish_run"), _timed(paths, "publish_run"):
        return _publish(paths, run_settings(paths))


@contextmanager
def _timed(paths: RunPaths, stage: str) -> Iterator[None]:
    """Record this attempt of ``stage`` in the run's recorded times (``_amend_times``): its
    wall seconds, or none if it raised (an earlier attempt's figure would be taken for it)."""
    started = time.perf_counter()
    try:
        yield
    except BaseException:
        _amend_times(paths, {stage: None})
        raise
    _amend_times(paths, {stage: round(time.perf_counter() - started, 3)})


def _amend_times(paths: RunPaths, seconds: dict[str, float | None]) -> None:
    """Update ``paths.stage_times`` after a stage run on its own (``recs validate``,
    ``recs publish``), so ``recs report`` shows each stage's latest attempt, never an earlier
    one's: a figure set, or forgotten with None. A ``recs shard run`` is one shard, not an
    attempt of the stage: the stage's figure stands. Only where ``recs run`` recorded times
    (``_record_times``): a DAG run's come from Airflow; a damaged or unreadable record is left
    to the report, and one that cannot be written (a full disk) only logs: the stage's own
    outcome stands. A stage that passes here clears the record of the last ``recs run``
    stopping at it (a review's publish passed and the report still showed it failed).
    """
    try:
        document = read_json(paths.stage_times)
        recorded = document.get("stages")
    except (RecsError, OSError):  # none, damaged, unreadable (EIO, a folder in its place)
        return
    if not isinstance(recorded, dict):
        return
    forgotten = {name for name, value in seconds.items() if value is None}
    amended = {name: value for name, value in recorded.items() if name not in forgotten}
    amended.update({name: value for name, value in seconds.items() if value is not None})
    stopped = stopped_at(document)
    passed = stopped is not None and seconds.get(stopped["stage"]) is not None
    if amended != recorded or passed:
        kept = {k: v for k, v in document.items() if not (passed and k == "stopped_at")}
        try:  # where the last `recs run` stopped, until that stage has passed on its own
            write_json(paths.stage_times, {**kept, "stages": amended})
        except OSError as error:
            log.warning("could not record the stage times in %s: %s", paths.stage_times, error)


def run_all(
    home: Path,
    snapshot_date: str | dt.date,
    run_id: str | None = None,
    settings: Settings | None = None,
    progress=None,
    *,
    rebuild_snapshot: bool = False,
) -> dict[str, Any]:
    """Run every stage in order in this process (the DAG without Airflow), timing each, holding
    the run's lock throughout (a second ``run_all`` of the run id is refused at once:
    ``RunInProgressError``).

    ``progress``, if given, is called as ``progress(stage_name)`` before each stage and
    ``progress("traverse_shard NNN failed: …")`` after a shard that raised; ``rebuild_snapshot`` as
    ``freeze_snapshot``'s ``rebuild``. A shard that raises is tried once (no retries here) and
    recorded, and the run goes on: the gate validates the computed shards and the publish carries
    the failed ones over. Returns ``{"run_id", "snapshot_date", "stages": {name: {"seconds",
    "result"}}, "failed_shards": [{"shard_id", "error"}], "seconds"}``. Raises whatever any other
    stage raises; nothing is published unless validation passed. A run refused or failed before
    its snapshot exists (a day not over, a past date with nothing retained, the store away)
    leaves no folder behind when this call made it: ``recs runs`` and ``gc`` never see it.
    """
    paths = RunPaths.create(home, snapshot_date, run_id)
    with _locked_until_frozen(paths):
        # before the first stage's progress line: a newcomer read "→ freeze_snapshot" above
        # the refusal and took the freeze for started (the freeze checks it too)
        point_in_time.refuse_cut_off_ahead(paths, wall_clock())
        return _run_all(paths, settings, progress, rebuild_snapshot)


@contextmanager
def _locked_until_frozen(paths: RunPaths) -> Iterator[None]:
    """Hold the run's lock for the block; if the block raises before the run's snapshot exists
    and the run folder did not exist before it (``recs run``, or the DAG's freeze_snapshot, of a
    new run refused for a day not over, a past date with nothing retained, the store away), the
    folder (holding only ``.lock``) and its date's, if empty, are removed under the lock: nobody
    else is in the run, and ``recs runs`` and ``gc`` never see it. A folder found is kept."""
    made = not paths.run_dir.exists()
    with run_lock(paths):
        try:
            yield
        except BaseException:
            if made and not paths.snapshot_manifest.exists():
                shutil.rmtree(paths.run_dir, ignore_errors=True)
                try:
                    paths.run_dir.parent.rmdir()
                except OSError:
                    pass  # other runs of the date, or already gone
            raise


def _run_all(paths: RunPaths, settings, progress, rebuild_snapshot: bool) -> dict[str, Any]:
    stages: dict[str, Any] = {}
    started = time.perf_counter()

    def timed(name: str, func, *args):
        if progress is not None:
            progress(name)
        t0 = time.perf_counter()
        try:
            result = func(*args)
        except BaseException as error:
            _record_stop(paths, stages, name, error)
            raise
        stages[name] = {"seconds": round(time.perf_counter() - t0, 3), "result": result}
        _record_times(paths, stages)
        return result

    timed("freeze_snapshot", lambda: freeze_snapshot(paths, settings, rebuild=rebuild_snapshot))
    timed("build_models", build_models, paths)
    timed("build_graph", build_graph, paths)
    shard_ids = timed("plan_shards", plan_shards, paths)
    shard_results = []
    failed: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for shard_id in shard_ids:
        if progress is not None:
            progress(f"traverse_shard {shard_id:03d}")
        try:
            shard_results.append(traverse_shard(paths, shard_id))
        except (KeyboardInterrupt, SystemExit) as error:  # the run stops, not only the shard
            _record_stop(paths, stages, "traverse_shard", error)
            raise
        except Exception as error:  # noqa: BLE001 - a failed shard is carried over, not fatal
            message = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
            log.warning("run %s: shard %03d failed: %s", paths.run_id, shard_id, message)
            failed.append({"shard_id": shard_id, "error": message})
            if progress is not None:
                progress(f"traverse_shard {shard_id:03d} failed: {message}")
    stages["traverse_shard"] = {
        "seconds": round(time.perf_counter() - t0, 3),
        "result": {"shards": len(shard_results), "failed": [f["shard_id"] for f in failed]},
    }
    _record_times(paths, stages)
    timed("validate_shards", validate_shards, paths, shard_ids)
    timed("validate_run", validate_run, paths)
    timed("publish_run", publish_run, paths)
    return {
        "run_id": paths.run_id,
        "snapshot_date": paths.snapshot_date.isoformat(),
        "stages": stages,
        "failed_shards": failed,
        "seconds": round(time.perf_counter() - started, 3),
    }


STOP_ERROR_CHARACTERS = 2000
"""How much of the error ``_record_stop`` keeps: our messages are one line, the remedy last
(a review found the in-degrees' cut at 300 before the command that mends them)."""


def _record_times(
    paths: RunPaths, stages: dict[str, Any], stopped_at: dict[str, str] | None = None
) -> None:
    """Save the wall seconds of the stages ``run_all`` has finished so far in
    ``paths.stage_times`` (``{"stages": {name: seconds}}``), and ``stopped_at`` if given, for
    ``recs summary`` and ``recs report``: a DAG run's come from Airflow's task instances, a
    ``recs run``'s from here."""
    document: dict[str, Any] = {"stages": {n: s["seconds"] for n, s in stages.items()}}
    if stopped_at is not None:
        document["stopped_at"] = stopped_at
    write_json(paths.stage_times, document)


def _record_stop(
    paths: RunPaths, stages: dict[str, Any], stage: str, error: BaseException
) -> None:
    """``_record_times`` with the stage ``run_all`` stopped at: ``{"stage", "error"}`` (its
    class and message, whitespace folded, ``STOP_ERROR_CHARACTERS`` at most). (A newcomer's
    rerun stopped at build_graph; the summary said nothing of it.) A record that cannot be
    written only logs: the stage's error is the run's."""
    problem = " ".join(str(error).split())[:STOP_ERROR_CHARACTERS]
    stopped = {
        "stage": stage,
        "error": f"{type(error).__name__}: {problem}" if problem else type(error).__name__,
    }
    try:
        _record_times(paths, stages, stopped)
    except OSError as failed:  # a full disk: the stage's own error stands
        log.warning("could not record where run %s stopped: %s", paths.run_id, failed)
