"""What each nightly stage reads from and writes to the run store, as *parts* (``artifacts``).

A part is the outputs of one stage, paths relative to the run folder: ``snapshot``
(freeze_snapshot), ``models`` (build_models: ``exports/`` and ``dbt/``), ``warehouse`` (its
DuckDB file, read by dbt-docs only), ``dbt_docs``, ``graph_plan`` (plan_graph),
``graph_shard_id=NNN`` (cap_graph: one partition's piece), ``graph`` (build_graph, the
assembly), ``shard_id=NNN`` (traverse_shard), ``gate_shard_id=NNN`` (validate_shard) and
``validation`` (validate_run, without the shards' results). ``stage_inputs`` /
``stage_outputs`` are the table of which stage pulls and pushes which; ``artifacts.synced``
applies it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """The outputs of one stage: files under ``roots`` (relative to the run folder, folders or
    files), minus those under ``exclude``; hidden names (``.*``: a killed attempt's staging
    files, the locks) are never part of one."""

    name: str
    roots: tuple[str, ...]
    exclude: tuple[str, ...] = ()

    def covers(self, relative: str) -> bool:
        inside = any(relative == root or relative.startswith(root + "/") for root in self.roots)
        hidden = any(piece.startswith(".") for piece in relative.split("/"))
        return inside and not hidden and not any(relative.startswith(e) for e in self.exclude)


SNAPSHOT = Part("snapshot", ("snapshot",))
MODELS = Part("models", ("exports", "dbt"), exclude=("dbt/docs/",))
WAREHOUSE = Part("warehouse", ("warehouse.duckdb",))
DBT_DOCS = Part("dbt_docs", ("dbt/docs",))
GRAPH_PLAN = Part("graph_plan", ("graph_pieces/plan.json", "graph_pieces/reciprocal_pairs.npy"))
GRAPH = Part("graph", ("graph",))
VALIDATION = Part("validation", ("validation",), exclude=("validation/shards/",))
SNAPSHOT_MANIFEST = ("snapshot/manifest.json",)


def shard_part(shard_id: int) -> Part:
    """``shards/shard_id=NNN/``: one shard's recommendations and manifest (traverse_shard)."""
    return Part(f"shard_id={shard_id:03d}", (f"shards/shard_id={shard_id:03d}",))


def graph_piece_part(shard_id: int) -> Part:
    """``graph_pieces/shard_id=NNN/``: one partition's capped follows (cap_graph)."""
    return Part(f"graph_shard_id={shard_id:03d}", (f"graph_pieces/shard_id={shard_id:03d}",))


def gate_part(shard_id: int) -> Part:
    """``validation/shards/shard_id=NNN/``: one shard's saved gate result (validate_shard)."""
    return Part(f"gate_shard_id={shard_id:03d}", (f"validation/shards/shard_id={shard_id:03d}",))


Inputs = list[tuple[Part, tuple[str, ...] | None, bool]]


def stage_inputs(stage: str, shard_id: int | None, shard_count: int) -> Inputs:
    """What ``stage`` reads, as ``(part, include globs or None for all, required)``; the
    snapshot manifest (every stage's settings) is pulled before these."""
    every_shard = range(shard_count)
    if stage == "build_models":
        return [(SNAPSHOT, None, True)]
    if stage == "dbt_docs":
        return [(MODELS, None, True), (WAREHOUSE, None, True)]
    graph_exports = ("exports/candidate_profiles.parquet", "exports/hub_accounts.parquet")
    if stage == "build_graph":  # in one process: plan, every piece, assembly
        return [
            (
                SNAPSHOT,
                (
                    "snapshot/users.parquet",
                    "snapshot/follow_edges/*",
                    "snapshot/in_degrees.parquet",
                ),
                True,
            ),
            (MODELS, graph_exports, True),
        ]
    if stage == "plan_graph_reciprocal":  # the pairs followed back: every partition
        return [(SNAPSHOT, ("snapshot/users.parquet", "snapshot/follow_edges/*"), True)]
    if stage == "cap_graph":
        return [
            (
                SNAPSHOT,
                ("snapshot/users.parquet", f"snapshot/follow_edges/shard_id={shard_id:03d}/*"),
                True,
            ),
            (MODELS, ("exports/candidate_profiles.parquet",), True),
            (GRAPH_PLAN, None, True),
        ]
    if stage == "assemble_graph":  # the in-degrees: checked against the pieces' sums
        return [
            (SNAPSHOT, ("snapshot/users.parquet", "snapshot/in_degrees.parquet"), True),
            (MODELS, graph_exports, True),
            (GRAPH_PLAN, None, True),
            *((graph_piece_part(i), None, True) for i in every_shard),
        ]
    if stage == "traverse_shard":
        return [
            (SNAPSHOT, (f"snapshot/follow_edges/shard_id={shard_id:03d}/*",), True),
            (
                MODELS,
                (
                    f"exports/eligible_users/shard_id={shard_id}/*",
                    f"exports/follow_exclusions/shard_id={shard_id}/*",
                    "exports/hub_accounts.parquet",
                ),
                True,
            ),
        ]
    if stage == "validate_shard":
        return [
            (SNAPSHOT, (f"snapshot/follow_edges/shard_id={shard_id:03d}/*",), True),
            (
                MODELS,
                (
                    "exports/eligible_users/*",
                    f"exports/follow_exclusions/shard_id={shard_id}/*",
                    "exports/candidate_profiles.parquet",
                ),
                True,
            ),
            (shard_part(shard_id), None, False),
        ]
    if stage == "validate_run":  # it validates again any shard whose saved result is stale
        return [
            (SNAPSHOT, ("snapshot/follow_edges/*",), True),
            (MODELS, ("exports/*",), True),
            (GRAPH, ("graph/meta.json",), True),
            *((shard_part(i), None, False) for i in every_shard),
            *((gate_part(i), None, False) for i in every_shard),
        ]
    if stage == "publish_run":
        return [
            (MODELS, ("exports/*",), True),
            (VALIDATION, None, True),
            *((shard_part(i), None, False) for i in every_shard),
        ]
    return []


def stage_outputs(stage: str, shard_id: int | None) -> tuple[list[Part], list[Part]]:
    """``(parts the stage pushes when it succeeds, parts it withdraws when it starts)``."""
    writes = {
        "freeze_snapshot": [SNAPSHOT],
        "build_models": [MODELS, WAREHOUSE],
        "dbt_docs": [DBT_DOCS],
        "build_graph": [GRAPH],
        "plan_graph": [GRAPH_PLAN],
        "plan_graph_reciprocal": [GRAPH_PLAN],
        "cap_graph": [graph_piece_part(shard_id)] if shard_id is not None else [],
        "assemble_graph": [GRAPH],
        "traverse_shard": [shard_part(shard_id)] if shard_id is not None else [],
        "validate_shard": [gate_part(shard_id)] if shard_id is not None else [],
        "validate_run": [VALIDATION],
    }.get(stage, [])
    withdraws = [*writes, DBT_DOCS] if stage == "build_models" else list(writes)
    if stage == "freeze_snapshot":  # swapped in whole at its end, and push forgets it first:
        withdraws = []  # a freeze refused or failed leaves the earlier attempt's usable
    if stage.startswith("plan_graph"):  # a new plan: the graph is assembled again from it
        withdraws.append(GRAPH)
    return writes, withdraws


PUSHED_ON_FAILURE = frozenset({"validate_run"})
"""Stages whose outputs are pushed also when they raise: the gate's ``summary.json`` is
rewritten on every outcome, so a publish elsewhere never finds an older pass."""


