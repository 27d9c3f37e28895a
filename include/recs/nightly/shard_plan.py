"""The shard plan of a run: how many mapped traversal tasks, from the number of eligible users.

``shard_count = clamp(ceil(eligible / shard_users_target), shard_count_min, shard_count_max)``,
or ``Settings.shard_count`` when it is set (a fixed plan). It is made once, by
``freeze_snapshot``, from the users of the snapshot (the eligibility rule of the dbt model
``eligible_users``: active, and active within ``eligibility_window_days`` of the cut-off; the
gate checks the two counts agree), frozen into the run's manifest, and checked against the
deployment's Airflow ``max_map_length`` before any heavy stage runs. The gate's mapped tasks
check the shards in groups (``task_groups``).

Light module (standard library only): the DAG calls ``check_map_length`` at task run time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from recs.errors import ShardPlanError


@dataclass(frozen=True)
class ShardPlan:
    """``shard_count`` shards for ``eligible_users`` users; ``rule`` says how it was chosen."""

    shard_count: int
    eligible_users: int
    users_per_shard_target: int
    rule: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_shards(
    eligible_users: int,
    *,
    fixed: int | None,
    users_target: int,
    minimum: int,
    maximum: int,
    max_map_length: int | None = None,
) -> ShardPlan:
    """The plan for ``eligible_users`` users (module docstring). ``max_map_length`` is
    Airflow's ``[core] max_map_length`` of the deployment (None outside Airflow). Raises
    ``ShardPlanError`` if ``minimum > maximum`` or the plan exceeds ``max_map_length``."""
    if minimum > maximum:
        raise ShardPlanError(
            f"shard_count_min {minimum} is above shard_count_max {maximum} "
            "(RECS_SHARD_COUNT_MIN, RECS_SHARD_COUNT_MAX)"
        )
    if fixed is not None:
        count, rule = fixed, "fixed by RECS_SHARD_COUNT"
    else:
        wanted = max(math.ceil(eligible_users / users_target), 1)
        count = min(max(wanted, minimum), maximum)
        rule = (
            f"ceil({eligible_users:,} eligible / {users_target:,} per shard) = {wanted}, "
            f"within {minimum}..{maximum}"
        )
    plan = ShardPlan(count, eligible_users, users_target, rule)
    check_map_length(plan.shard_count, max_map_length)
    return plan


def plan_for(eligible_users: int, settings, max_map_length: int | None = None) -> ShardPlan:
    """``plan_shards`` with the plan's settings (``Settings.shard_count``,
    ``shard_users_target``, ``shard_count_min``, ``shard_count_max``)."""
    return plan_shards(
        eligible_users,
        fixed=settings.shard_count,
        users_target=settings.shard_users_target,
        minimum=settings.shard_count_min,
        maximum=settings.shard_count_max,
        max_map_length=max_map_length,
    )


def check_map_length(shard_count: int, max_map_length: int | None) -> None:
    """Raise ``ShardPlanError`` if ``shard_count`` mapped tasks exceed ``max_map_length``."""
    if max_map_length is not None and shard_count > max_map_length:
        raise ShardPlanError(
            f"the shard plan has {shard_count} shards but Airflow's [core] max_map_length is "
            f"{max_map_length}: raise max_map_length (AIRFLOW__CORE__MAX_MAP_LENGTH), lower "
            "RECS_SHARD_COUNT_MAX, or raise RECS_SHARD_USERS_TARGET"
        )


def task_groups(shard_ids: list[int], shards_per_task: int) -> list[list[int]]:
    """The planned ``shard_ids`` cut into consecutive groups of at most ``shards_per_task``, one
    mapped task each (``validate_shards``: ``Settings.gate_shards_per_task``; ``cap_graph``:
    ``graph_partitions_per_task``), as evenly as that many groups allow: 16 shards at 8 per
    task are ``[[0..7], [8..15]]``, 10 are 5 and 5.
    Raises ``ValueError`` if ``shards_per_task`` is below 1."""
    if shards_per_task < 1:
        raise ValueError(f"shards_per_task must be at least 1, not {shards_per_task}")
    n_groups = math.ceil(len(shard_ids) / shards_per_task)
    if n_groups == 0:
        return []
    size, extra = divmod(len(shard_ids), n_groups)
    groups, start = [], 0
    for group in range(n_groups):
        end = start + size + (1 if group < extra else 0)
        groups.append(list(shard_ids[start:end]))
        start = end
    return groups
