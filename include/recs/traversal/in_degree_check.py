"""The snapshot's in-degrees checked against its follow edges, by sums the graph's pieces add up.

The freeze counts ``snapshot/in_degrees.parquet`` as it writes the follow edges (the rule,
``recs.nightly.in_degrees``: an account's active follows, self-follows left out), and dbt carries
it into the hubs, the candidate profiles and the popularity index. ``cap_graph`` reads every
follow edge anyway, one partition per mapped task: each file's ``EdgeCounts`` add, over its
active follows that are not self-follows, how many there are (``in_degree_follows``) and the
sums of their ``followee_id`` (``followee_id_sum``) and of ``sampling.mix64`` of it
(``followee_hash_sum``), both modulo 2**64. ``build_graph`` adds up the pieces' and ``check``
compares them with the file's counts weighted the same way: a row lost, an emptied file, counts
of another snapshot or moved between accounts change at least one sum (counts moved between
accounts whose ids sum the same change the hashed one but for a 2**-64 chance). A wrong file stops
the night before any shard task is traversed or published; dbt has built its models from it by
then (the hubs, the profiles, the popularity index), and nothing reads them before
``build_graph``. The check runs once per assembly: a graph already assembled from the run's
plan and kept by a retry of ``build_graph`` is not checked again (each ``plan_graph`` makes a
plan of its own, with its own ``plan_id``, and withdraws it). A mismatch is an
``InDegreeMismatchError``, which the DAG's ``build_graph`` does not retry.

Why here: this was a dbt test scanning every follow edge in the build's one process (7.1 s of
the 36.6 s build at 5 M users for the count alone, ``bench/README.md``); the pieces' sums cost
one pass over arrays their tasks hold, spread over the mapped tasks, and the check reads a file
the size of the users table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from recs.contracts import IN_DEGREES_FILE
from recs.errors import CorruptFileError, RunNotFoundError
from recs.files import read_parquet
from recs.sampling import mix64_array

MODULUS = 1 << 64
"""The weighted sums are compared modulo 2**64 (NumPy's ``uint64`` arithmetic wraps)."""


def followee_sums(followers: np.ndarray, followees: np.ndarray) -> tuple[int, int, int]:
    """``(follows, followee_id_sum, followee_hash_sum)`` of active follows given as ``int64``
    arrays of ``follower_id`` and ``followee_id`` (one row each), self-follows left out; the
    sums modulo 2**64."""
    followees = followees[followers != followees]
    ids = followees.astype(np.uint64)
    return len(ids), int(ids.sum(dtype=np.uint64)), int(mix64_array(ids).sum(dtype=np.uint64))


def in_degree_sums(snapshot_dir: Path) -> tuple[int, int, int]:
    """``(sum of in_degree, sum of user_id * in_degree, sum of mix64(user_id) * in_degree)`` of
    ``snapshot_dir/in_degrees.parquet``, the last two modulo 2**64. Raises ``RunNotFoundError``
    if the file is missing (a snapshot frozen before the in-degrees: ``build_models`` refuses
    it first), ``CorruptFileError`` if it cannot be read."""
    path = Path(snapshot_dir) / IN_DEGREES_FILE
    if not path.exists():
        raise RunNotFoundError(f"missing {path}: freeze the snapshot again (it counts them)")
    frame = read_parquet(path, ["user_id", "in_degree"])
    ids = frame["user_id"].to_numpy().astype(np.uint64)
    degrees = frame["in_degree"].to_numpy().astype(np.uint64)
    return (
        int(degrees.sum(dtype=np.uint64)),
        int((ids * degrees).sum(dtype=np.uint64)),
        int((mix64_array(ids) * degrees).sum(dtype=np.uint64)),
    )


class InDegreeMismatchError(CorruptFileError):
    """The in-degrees do not weigh up to the follow edges (``check``): no retry mends it, only
    a snapshot made again (the DAG's build_graph fails at once on it)."""


def check(paths: Any, counts: Any) -> None:
    """Raise ``InDegreeMismatchError`` (one line, every sum, the command that mends it) unless the
    in-degrees of ``paths.snapshot_dir`` (a ``RunPaths``) weigh up to ``counts``
    (``capped_rows.EdgeCounts`` of every piece, added up) as the module docstring says."""
    snapshot_dir = paths.snapshot_dir
    counted = in_degree_sums(snapshot_dir)
    edges = (
        counts.in_degree_follows,
        counts.followee_id_sum % MODULUS,
        counts.followee_hash_sum % MODULUS,
    )
    if counted == edges:
        return
    names = ("follows", "id-weighted", "hash-weighted")
    differ = ", ".join(
        f"{name} {mine:,} against {theirs:,}"
        for name, mine, theirs in zip(names, counted, edges, strict=True)
        if mine != theirs
    )
    raise InDegreeMismatchError(
        f"the in-degrees of run {paths.run_id} ({Path(snapshot_dir) / IN_DEGREES_FILE}) do not "
        f"match its follow edges' active follows ({differ}): the file or the edges changed after "
        "the freeze counted them, or the file is another snapshot's; make the date's snapshot "
        "again from the live store: `recs run --snapshot-date "
        f"{paths.snapshot_date.isoformat()} --run-id {paths.run_id} --rebuild-snapshot` (the DAG's "
        "rebuild_snapshot param)"
    )
