"""Withdrawing what an earlier attempt of a run computed, here and in the run store, so no
stage, ``recs summary`` or ``recs report`` takes it for this attempt's.

Two moments (``pipeline``): a freeze that succeeded withdraws everything computed from the
earlier snapshot (``withdraw_results``); ``plan_shards`` makes the shard plan the truth
(``withdraw_shards``: a rerun cleared from build_graph on, or one planned with fewer shards).
Both hold the run's lock. A freeze that fails withdraws nothing: the earlier attempt stays.
Published versions keep their own copies (hard links or copies); each shard's saved gate result
stays (``shard_gate.saved_result`` reuses it only for the same output and inputs). Another
machine's local copies change as its next stage pulls (``artifacts.synced``).
"""

from __future__ import annotations

import logging
import re
import shutil

from recs.nightly import artifacts
from recs.nightly.checkpoints import DATA_DOCS_DIR
from recs.nightly.parts import GRAPH, VALIDATION
from recs.nightly.runs import RunPaths

log = logging.getLogger(__name__)

_SHARD_DIR = re.compile(r"shard_id=(\d+)")
"""A shard's folder under ``shards/``, here and in the run store."""
_SHARD_MARKER = re.compile(r"shard_id=(\d+)\.json")
"""A shard's marker under the store's ``.parts/`` (not a graph piece's or a gate's:
``graph_shard_id=NNN.json``, ``gate_shard_id=NNN.json``)."""


def withdraw_results(paths: RunPaths, shard_count: int) -> None:
    """Withdraw what an earlier attempt of the run computed from its snapshot, once this
    attempt has frozen its own: the shards (``withdraw_shards``), the graph (its
    ``meta.json``, written last), the gate's verdict (``paths.validation_summary``,
    ``validation_results`` and the Data Docs), the stage times and stop a ``recs run`` recorded
    (``paths.stage_times``: ``recs run`` records this attempt's next; a DAG run's come from
    Airflow, and a review's DAG rerun still showed "last recs run: stopped at …") and dbt's run
    results (``paths.dbt_run_results``, whose seconds and problems the report shows; the
    models' exports stay until ``build_models`` replaces them: no stage reads them without
    this attempt's graph); in a run store the markers of the graph and the verdict too. (A
    newcomer's rerun that failed at build_graph still showed the earlier attempt's "4 of 4"
    shards and "validation passed"; one stopped at build_models let a review traverse shards
    on the earlier graph.)"""
    withdraw_shards(paths, shard_count)
    for done in (
        paths.graph_dir / "meta.json",
        paths.validation_summary,
        paths.validation_results,
        paths.stage_times,
        paths.dbt_run_results,
    ):
        done.unlink(missing_ok=True)
    shutil.rmtree(paths.validation_dir / DATA_DOCS_DIR, ignore_errors=True)
    store = artifacts.run_store()
    if store is not None:
        store.forget(paths, GRAPH)
        store.forget(paths, VALIDATION)


def withdraw_shards(paths: RunPaths, shard_count: int) -> None:
    """Make the plan of ``shard_count`` shards the truth: a shard counts as computed only once
    this plan's traversal has written it (its manifest last, and in a run store its marker).
    Here, the planned shards' manifests go and ``shards/shard_id=NNN/`` folders with NNN >=
    ``shard_count`` (left by a plan with more shards) are removed; in a run store, the planned
    shards' markers go (their files stay until the traversal replaces them) and the shards
    beyond the plan are removed whole."""
    removed = []
    for folder in sorted(paths.shards_dir.glob("shard_id=*")):
        match = _SHARD_DIR.fullmatch(folder.name)
        if match and int(match.group(1)) >= shard_count and folder.is_dir():
            shutil.rmtree(folder)
            removed.append(folder.name)
    for shard_id in range(shard_count):
        paths.shard_manifest(shard_id).unlink(missing_ok=True)
    if removed:
        log.info("plan %s: removed shard folders outside the plan: %s", paths.run_id, removed)
    _withdraw_store_shards(paths, shard_count)


def _withdraw_store_shards(paths: RunPaths, shard_count: int) -> None:
    """``withdraw_shards`` in the run store, if one is set, in four requests at most: two
    listings find what it holds (``shards/`` and the markers), one removes the markers (the
    planned shards' and those beyond the plan, first: a reader never trusts a half-removed
    part), one the folders of the shards beyond the plan. (A review counted about 2,000
    requests a night at 1,024 shards when each planned shard was asked about.)"""
    store = artifacts.run_store()
    if store is None:
        return
    beyond = [name for name in store.names(paths, "shards")
              if (m := _SHARD_DIR.fullmatch(name)) and int(m.group(1)) >= shard_count]  # fmt: skip
    markers = [name for name in store.names(paths, artifacts.MARKERS)
               if _SHARD_MARKER.fullmatch(name)]  # fmt: skip
    store.remove_files(paths, [f"{artifacts.MARKERS}/{name}" for name in markers])
    store.remove_files(paths, [f"shards/{name}" for name in beyond], recursive=True)
