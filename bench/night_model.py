"""The end-to-end capacity model of the design's night, from the stage rates ``make bench-scale``
measured (every stage, not the traversal alone; ``bench/traversal.py`` models the traversal).

The night (ARCHITECTURE "Scale the design is for"): 500 M accounts, 60 B follow edges, 220 M
users refreshed inside a 4-hour window. Each stage's measured cost is divided by the quantity it
grows with, then multiplied by the night's:

| stage | grows with | night's quantity |
| --- | --- | --- |
| freeze_snapshot, cap_graph, build_graph | follow edges | 60 B |
| build_models | accounts | 500 M |
| traverse_shard | traversals | 220 M x (measured traversals per eligible user) |
| validate_shards, validate_run, publish_run | published rows | 220 M x (rows per eligible user) |

``build_models`` grows with the accounts since the dbt build stopped reading the follow edges
(``recs.traversal.in_degree_check``, 2026-12-07): its models read the users-sized tables (the
in-degrees counted by the freeze, the interests, blocks, mutes and dismissals); only the
``stg_follow_edges`` column tests still touch the edges, answered mostly from the Parquet
statistics (1.8 s of the 5 M build's node time on a44e070), and are scaled with the accounts too.

Linear in each: the stages sort and scan (n log n is within a few percent of n over this
range), and the traversal's cost per expansion is flat (``make bench``). A stage that runs as one
process today has **its wall time** scaled (it cannot use more than the cores of one machine,
and most of its time is one core's); a mapped stage (``SPREAD``: one task per shard) has **its
CPU time** scaled and divided over ``cores``, and its peak memory is one task's (the shards
grow in number, not in size). Peak memory of a one-process stage scales with its quantity too,
which is the figure that says whether it can run on any machine at all.

``plan_graph`` is left out: in the shipped hop orders it reads the snapshot manifest only, a
fixed cost (with a ``reciprocity`` order it reads every follow once, and is not modelled).

Fixed costs (interpreter start-up, imports, dbt's parse, the runtime's resident memory) are
scaled as if they grew too, so a small run overstates the night: read the model from
``make bench-scale``'s default of 1 M users (or larger), not from a small trial.

``night_model(stages, ...)`` returns the rows; ``render`` the lines ``make bench-scale`` prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

NIGHT_EDGES = 60_000_000_000
NIGHT_ACCOUNTS = 500_000_000
NIGHT_REFRESHED = 220_000_000
WINDOW_SECONDS = 4 * 3600

BY_EDGES = ("freeze_snapshot", "cap_graph", "build_graph")
BY_ACCOUNTS = ("build_models",)
BY_ROWS = ("validate_shards", "validate_run", "publish_run")
# mapped: a task per group of partitions / shard / group of shards
SPREAD = ("cap_graph", "traverse_shard", "validate_shards")


@dataclass(frozen=True)
class StageCost:
    """One stage of the night: ``wall_hours`` as it runs today (one process; for the shard
    stage, spread over the model's cores), ``cpu_hours``, ``peak_gb`` of its largest process."""

    stage: str
    unit: str
    measured_units: float
    night_units: float
    wall_hours: float
    cpu_hours: float
    peak_gb: float
    spread: bool


def night_model(
    stages: list[dict[str, Any]],
    *,
    edges: int,
    accounts: int,
    eligible_users: int,
    traversals: int,
    rows: int,
    shard_peak_mb: float,
    cores: int,
) -> list[StageCost]:
    """The night's cost per stage from a measured run.

    ``stages``: ``make bench-scale``'s rows (``stage``, ``wall_seconds``, ``cpu_seconds``,
    ``peak_rss_mb``; a mapped stage's name starts with one of ``SPREAD``, e.g.
    ``traverse_shard x 16``); ``edges`` the run's follow edges, ``accounts`` its users,
    ``eligible_users`` its refreshed
    users, ``traversals`` and ``rows`` its totals; ``shard_peak_mb`` one traversal task's peak (it
    does not grow with the night: the shards do); ``cores`` the cores the mapped stages are
    spread over. Raises ``ValueError``
    for a measured quantity of zero (nothing to scale from)."""
    if min(edges, accounts, eligible_users, traversals, rows) <= 0:
        raise ValueError("a measured run with edges, accounts, eligible users, traversals and rows")
    per_user_traversals = traversals / eligible_users
    per_user_rows = rows / eligible_users
    night = {
        "edges": (edges, NIGHT_EDGES),
        "accounts": (accounts, NIGHT_ACCOUNTS),
        "traversals": (traversals, NIGHT_REFRESHED * per_user_traversals),
        "rows": (rows, NIGHT_REFRESHED * per_user_rows),
    }
    costs = []
    for row in stages:
        name = row["stage"]
        base = name.split(" ")[0]
        if base in BY_EDGES:
            unit = "edges"
        elif base in BY_ACCOUNTS:
            unit = "accounts"
        elif base in BY_ROWS:
            unit = "rows"
        elif base == "traverse_shard":
            unit = "traversals"
        else:
            continue  # generate_graph: not part of a night
        measured, needed = night[unit]
        scale = needed / measured
        cpu_hours = row["cpu_seconds"] * scale / 3600
        spread = base in SPREAD
        if spread:
            wall_hours = cpu_hours / cores
            task_mb = shard_peak_mb if unit == "traversals" else row.get("peak_rss_mb") or 0.0
            peak_gb = task_mb / 1024
        else:
            wall_hours = row["wall_seconds"] * scale / 3600
            peak_gb = (row.get("peak_rss_mb") or 0.0) * scale / 1024
        costs.append(StageCost(name, unit, measured, needed, wall_hours, cpu_hours, peak_gb,
                               spread))
    return costs


def cores_for_window(costs: list[StageCost]) -> float | None:
    """Cores the mapped stages need so the whole night fits ``WINDOW_SECONDS``; None when the
    one-process stages alone take the window or more (no number of cores helps)."""
    serial = sum(c.wall_hours for c in costs if not c.spread)
    left = WINDOW_SECONDS / 3600 - serial
    spread_cpu = sum(c.cpu_hours for c in costs if c.spread)
    return None if left <= 0 else spread_cpu / left


def render(costs: list[StageCost], cores: int, machine_gb: float) -> list[str]:
    """The model as printed lines (module docstring; ``machine_gb`` this machine's RAM)."""
    lines = [
        f"night model: {NIGHT_ACCOUNTS / 1e6:.0f} M accounts, {NIGHT_EDGES / 1e9:.0f} B follow "
        f"edges, {NIGHT_REFRESHED / 1e6:.0f} M users refreshed, a "
        f"{WINDOW_SECONDS / 3600:.0f} h window (bench/night_model.py: linear in each stage's "
        "quantity)",
        f"  {'stage':<22} {'scaled by':<11} {'x':>9} {'wall h':>9} {'CPU h':>9} "
        f"{'peak GB':>9}",
    ]
    for c in costs:
        how = f"/{cores} cores" if c.spread else "1 process"
        lines.append(
            f"  {c.stage:<22} {c.unit:<11} {c.night_units / c.measured_units:>9,.0f} "
            f"{c.wall_hours:>9,.1f} {c.cpu_hours:>9,.1f} {c.peak_gb:>9,.1f}  {how}"
        )
    serial = sum(c.wall_hours for c in costs if not c.spread)
    total = sum(c.wall_hours for c in costs)
    worst = max((c for c in costs if not c.spread), key=lambda c: c.peak_gb, default=None)
    lines.append(f"  night on {cores} shard cores: {total:,.1f} h ({serial:,.1f} h of it in the "
                 "one-process stages)")
    needed = cores_for_window(costs)
    if needed is None:
        lines.append(
            f"  -> does not fit the window at any core count: the one-process stages alone take "
            f"{serial:,.1f} h, and {worst.stage if worst else '-'} would need "
            f"{worst.peak_gb if worst else 0:,.0f} GB in one process (this machine: "
            f"{machine_gb:,.0f} GB); they must run per shard as the traversal and the gate do"
        )
    else:
        lines.append(f"  -> fits the window with {math.ceil(needed):,} cores for the shards")
    return lines
