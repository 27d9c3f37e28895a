"""Original user ids -> dense ids (positions in sorted ``user_ids``), vectorised and compiled.

The capped graph names accounts by dense id (``int32``); ``DenseIndex`` maps original ids to
them, and ``graph/id_index.npy`` persists it so shard tasks memory-map it instead of rebuilding
it. Compact ids (span at most ``4 * n + 65536``, as for the datasets and the store's own ids)
use an ``int32`` lookup table over the span; others a compiled open-addressing hash table
(Fibonacci hashing, Knuth TAOCP vol. 3 §6.4; at most half full). Unknown ids map to ``-1``.
Why not ``np.searchsorted``: ``bench/README.md``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from recs.traversal.jit import compiled

_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)


@compiled
def _hash_build(keys, bits):  # pragma: no cover - compiled
    """Open-addressing (linear probing) table of ``keys`` -> position, 2**bits slots."""
    size = 1 << bits
    mask = size - 1
    slot_keys = np.zeros(size, dtype=np.int64)
    slot_values = np.full(size, -1, dtype=np.int32)
    shift = np.uint64(64 - bits)
    for i in range(len(keys)):
        key = keys[i]
        h = np.int64((np.uint64(key) * _FIBONACCI) >> shift)
        while slot_values[h] >= 0 and slot_keys[h] != key:
            h = (h + 1) & mask
        slot_keys[h] = key
        slot_values[h] = i
    return slot_keys, slot_values


@compiled
def _hash_lookup(slot_keys, slot_values, bits, ids):  # pragma: no cover - compiled
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    out = np.empty(len(ids), dtype=np.int32)
    for i in range(len(ids)):
        key = ids[i]
        h = np.int64((np.uint64(key) * _FIBONACCI) >> shift)
        value = -1
        while slot_values[h] >= 0:
            if slot_keys[h] == key:
                value = slot_values[h]
                break
            h = (h + 1) & mask
        out[i] = value
    return out


@compiled
def _table_lookup(table, low, ids):  # pragma: no cover - compiled
    out = np.empty(len(ids), dtype=np.int32)
    size = len(table)
    for i in range(len(ids)):
        offset = ids[i] - low
        out[i] = table[offset] if 0 <= offset < size else -1
    return out


class DenseIndex:
    """Maps original user ids to dense ids: ``index(ids) -> int32`` (see the module docstring).

    Built from sorted unique ``user_ids`` (``int64``), or restored from ``saved()`` without
    rebuilding anything (``from_saved``).
    """

    def __init__(self, user_ids: np.ndarray):
        self.user_ids = user_ids
        self.table: np.ndarray | None = None
        self.hashed: tuple[np.ndarray, np.ndarray, int] | None = None
        self.low = 0
        n = len(user_ids)
        if n == 0:
            return
        self.low = int(user_ids[0])
        span = int(user_ids[-1]) - self.low + 1
        if span <= 4 * n + 65_536:
            self.table = np.full(span, -1, dtype=np.int32)
            self.table[np.asarray(user_ids, dtype=np.int64) - self.low] = np.arange(
                n, dtype=np.int32
            )
        else:
            bits = max(4, int(2 * n - 1).bit_length())
            slot_keys, slot_values = _hash_build(np.asarray(user_ids, dtype=np.int64), bits)
            self.hashed = (slot_keys, slot_values.astype(np.int64), bits)

    def saved(self) -> tuple[np.ndarray, dict[str, Any]]:
        """``(array, spec)`` to persist: the ``int32`` table, or the hash table as
        ``int64[2, 2**bits]`` (keys, positions); ``spec`` is JSON-able (``kind``, ``low``,
        ``bits``). ``from_saved`` inverts it without rebuilding anything."""
        if self.table is not None:
            return self.table, {"kind": "table", "low": self.low}
        if self.hashed is not None:
            slot_keys, slot_values, bits = self.hashed
            return np.stack([slot_keys, slot_values]), {"kind": "hash", "bits": bits}
        return np.zeros(0, dtype=np.int32), {"kind": "empty"}

    @classmethod
    def from_saved(cls, user_ids: np.ndarray, array: np.ndarray, spec: dict[str, Any]):
        """The index over ``user_ids`` from ``saved()``'s output (e.g. memory-mapped arrays)."""
        index = cls.__new__(cls)
        index.user_ids, index.table, index.hashed, index.low = user_ids, None, None, 0
        if spec["kind"] == "table":
            index.table, index.low = array, int(spec["low"])
        elif spec["kind"] == "hash":
            index.hashed = (array[0], array[1], int(spec["bits"]))
        return index

    def __call__(self, ids) -> np.ndarray:
        """Dense ids (``int32``: a graph has fewer than 2**31 nodes) of ``ids`` (any integer
        array); ``-1`` where unknown."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if len(self.user_ids) == 0:
            return np.full(len(ids), -1, dtype=np.int32)
        if self.table is not None:
            return _table_lookup(self.table, np.int64(self.low), ids)
        slot_keys, slot_values, bits = self.hashed
        return _hash_lookup(slot_keys, slot_values, bits, ids)
