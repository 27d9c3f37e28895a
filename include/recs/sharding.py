"""The stable shard function, defined once for Python, Polars and SQL (ARCHITECTURE §5).

``shard_of(user_id) = ((user_id * 2654435761) mod 2**32) div 2**16 mod shard_count``

This is Knuth's multiplicative (Fibonacci) hash (TAOCP vol. 3, §6.4, with the golden-ratio
constant 2654435761 = floor(2**32 / phi), made odd): keep the low 32 bits of the product and take
their *high* 16 bits, which mix every input bit, then reduce modulo the shard count. It uses only
integer arithmetic, so it is identical in Python, Polars, NumPy and DuckDB SQL and does not
depend on any engine's built-in ``hash()``, which changes between versions. The dbt macro
``shard_id`` (``dbt_project/macros/shard_id.sql``) is the SQL spelling; a test checks they agree.

A run's partitioned files live in ``shard_id=N/`` folders (``partition_files`` lists them): a
light module, so the gate finds them without importing the traversal's compiled code.
"""

from __future__ import annotations

import re
from pathlib import Path

KNUTH_MULTIPLIER = 2654435761
_LOW32 = 0xFFFFFFFF
_PARTITION_DIR = re.compile(r"^shard_id=(\d+)$")


def shard_of(user_id: int, shard_count: int) -> int:
    """Shard of one user id (``0 <= result < shard_count``); ``user_id`` must be >= 0.

    Raises ``ValueError`` for a negative id or a shard count below 1.
    """
    if user_id < 0:
        raise ValueError(f"user_id must be non-negative, got {user_id}")
    if shard_count < 1:
        raise ValueError(f"shard_count must be >= 1, got {shard_count}")
    return (((user_id * KNUTH_MULTIPLIER) & _LOW32) >> 16) % shard_count


def shard_expr(column: str, shard_count: int):
    """The same function as a Polars expression over an integer column; yields ``Int32``.

    UInt64 multiplication wraps modulo 2**64, and 2**32 divides 2**64, so the low 32 bits of
    the product are exact even when the full product overflows.
    """
    import polars as pl

    hashed = (pl.col(column).cast(pl.UInt64) * pl.lit(KNUTH_MULTIPLIER, pl.UInt64)) & pl.lit(
        _LOW32, pl.UInt64
    )
    return ((hashed // 65536) % shard_count).cast(pl.Int32)


def shard_array(user_ids, shard_count: int):
    """The same function over a NumPy integer array; yields ``int32`` shard ids."""
    import numpy as np

    with np.errstate(over="ignore"):
        hashed = (user_ids.astype(np.uint64) * np.uint64(KNUTH_MULTIPLIER)) & np.uint64(_LOW32)
    return ((hashed >> np.uint64(16)) % np.uint64(shard_count)).astype(np.int32)


def misfiled(followers, shard_id: int, shard_count: int) -> str | None:
    """None if every id of ``followers`` (a NumPy integer array: a snapshot partition's
    ``follower_id``) is of shard ``shard_id``; otherwise how many are not, with the first,
    ending "the partition is not as freeze_snapshot wrote it" and the remedy (for the caller's
    error, after the partition's name). Its shard's task would never see such a follow."""
    import numpy as np

    if not len(followers):
        return None
    shards = shard_array(followers, shard_count)
    wrong = np.flatnonzero(shards != shard_id)
    if not len(wrong):
        return None
    first = int(wrong[0])
    return (
        f"follow edges with a follower of another shard: {len(wrong)} (e.g. follower "
        f"{int(followers[first])}, of shard {int(shards[first])} of {shard_count}): the "
        "partition is not as freeze_snapshot wrote it; make the date's snapshot again from the "
        "live store with --rebuild-snapshot (the DAG's rebuild_snapshot param)"
    )


def shard_sql(column: str, shard_count: int | str) -> str:
    """The same function as a DuckDB SQL expression. The low 32 bits of the product depend only
    on the id's low 32 bits, so the id is reduced first and the product (< 2**64) fits a
    UBIGINT: no HUGEINT per row (the dbt macro ``shard_id`` compiles to exactly this text)."""
    product = f"((({column}) % 4294967296)::ubigint * {KNUTH_MULTIPLIER})"
    return f"(({product} % 4294967296) // 65536 % {shard_count})::integer"


def partition_files(root: Path) -> dict[int, list[Path]]:
    """Parquet files of a Hive-partitioned folder, by shard id: ``{shard_id: [file, ...]}``.

    Reads ``root/shard_id=N/*.parquet`` whether ``N`` is zero-padded (``freeze_snapshot``
    writes ``shard_id=007``) or not (DuckDB exports write ``shard_id=7``). Files are sorted by
    name so the read order, and so the output, is deterministic. A missing ``root`` yields ``{}``.
    """
    found: dict[int, list[Path]] = {}
    root = Path(root)
    if not root.is_dir():
        return found
    for child in sorted(root.iterdir()):
        match = _PARTITION_DIR.match(child.name)
        if match and child.is_dir():
            files = sorted(child.glob("*.parquet"))
            found.setdefault(int(match.group(1)), []).extend(files)
    return {shard: sorted(files) for shard, files in sorted(found.items())}
