"""The traversal: one shard's who-to-follow lists from the run's capped graph (ARCHITECTURE §1-3).

Flow: candidate generation → pre-rank filters (predicates) → ranking → filter-and-take, compiled
into one per-user loop; ``README.md`` beside this file maps the stages to modules and says why.
"""

from recs.traversal.graph import StaleGraphError
from recs.traversal.inputs import ShardMismatchError
from recs.traversal.shard import traverse_shard

__all__ = ["ShardMismatchError", "StaleGraphError", "traverse_shard"]
