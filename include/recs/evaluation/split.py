"""The train/test split: which follows are hidden from the product and scored against.

- **Random** (``random_split``, the default for graphs without times): every user with at least
  ``min_follows`` follows gets ``round(share * follows)`` of them (at least one) hidden, chosen
  uniformly by a seeded key per edge; those users are the test users. Every account of the
  file stays in the node universe.
- **Temporal** (``temporal_split``, for edges with times): the follows made after the
  ``quantile`` of all follow times are hidden; the node universe is the accounts of the
  earlier (training) follows; the test users are the accounts of the universe that made a
  hidden follow to another account of it (a hidden follow to an account first seen after
  the cut is dropped and counted: no method could recommend it).

The product and every baseline see only ``Split.train``; the exclusions are the same for all
(not self, not already followed in training).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from recs.arrays import sorted_unique
from recs.errors import DatasetError
from recs.evaluation.edges import EdgeList


@dataclass(frozen=True)
class Split:
    """``train``: ``EDGE_SCHEMA`` rows the product sees; ``test``: hidden follows
    (``user_id`` Int64, ``followee_id`` Int64), one row per pair, every user a test user;
    ``user_ids``: the node universe (sorted int64); ``kind``: ``random`` or ``temporal``;
    ``meta``: the split's settings and counts (JSON-able)."""

    kind: str
    train: pl.DataFrame
    test: pl.DataFrame
    user_ids: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def test_users(self) -> np.ndarray:
        """Sorted ids of the test users (int64)."""
        return sorted_unique(self.test["user_id"].to_numpy())


def _edge_keys(followers: np.ndarray, followees: np.ndarray, seed: int) -> np.ndarray:
    """A uniform random key per edge, a function of the pair and ``seed`` only (so the split
    does not depend on the file's row order)."""
    from recs.sampling import sample_keys

    return sample_keys(followers, followees, seed)


def random_split(edges: EdgeList, *, share: float, min_follows: int, seed: int) -> Split:
    """Hide ``share`` of the follows of each user with ``>= min_follows`` follows (module
    docstring). Raises ``DatasetError`` if no user qualifies."""
    if not 0.0 < share < 1.0:
        raise DatasetError(f"holdout share must be between 0 and 1, not {share}")
    frame = edges.edges
    followers = frame["follower_id"].to_numpy()
    followees = frame["followee_id"].to_numpy()
    keys = _edge_keys(followers, followees, seed)
    ranked = frame.with_columns(pl.Series("key", keys)).with_columns(
        pl.len().over("follower_id").alias("follows"),
        pl.col("key").rank("ordinal").over("follower_id").alias("position"),
    )
    hidden_count = (pl.col("follows") * share + 0.5).floor().clip(lower_bound=1)
    is_test = (pl.col("follows") >= min_follows) & (pl.col("position") <= hidden_count)
    test = ranked.filter(is_test).select(
        pl.col("follower_id").alias("user_id"), "followee_id"
    ).sort("user_id", "followee_id")
    if test.height == 0:
        raise DatasetError(f"{edges.name}: no user follows at least {min_follows} accounts")
    train = ranked.filter(~is_test).select(frame.columns)
    user_ids = sorted_unique(np.concatenate([followers, followees]))
    return Split(
        kind="random", train=train, test=test, user_ids=user_ids,
        meta={
            "split": "random", "share": share, "min_follows": min_follows, "seed": seed,
            "edges": frame.height, "train_edges": train.height, "test_edges": test.height,
            "users": len(user_ids), "test_users": test["user_id"].n_unique(),
        },
    )


def temporal_split(edges: EdgeList, *, quantile: float) -> Split:
    """Hide the follows made after the ``quantile`` of the follow times (module docstring).
    Raises ``DatasetError`` if the edges have no times or nothing is left on either side."""
    if not edges.has_times:
        raise DatasetError(f"{edges.name}: a temporal split needs a time on every edge")
    if not 0.0 < quantile < 1.0:
        raise DatasetError(f"temporal quantile must be between 0 and 1, not {quantile}")
    frame = edges.edges
    cut = float(np.quantile(frame["followed_at"].to_numpy(), quantile, method="lower"))
    train = frame.filter(pl.col("followed_at") <= cut)
    later = frame.filter(pl.col("followed_at") > cut)
    user_ids = sorted_unique(
        np.concatenate([train["follower_id"].to_numpy(), train["followee_id"].to_numpy()])
    )
    known = pl.Series(user_ids)
    test = later.filter(
        pl.col("follower_id").is_in(known) & pl.col("followee_id").is_in(known)
    ).select(pl.col("follower_id").alias("user_id"), "followee_id").sort("user_id", "followee_id")
    if train.height == 0 or test.height == 0:
        raise DatasetError(f"{edges.name}: the cut at quantile {quantile} leaves a side empty")
    return Split(
        kind="temporal", train=train, test=test, user_ids=user_ids,
        meta={
            "split": "temporal", "quantile": quantile, "cut_epoch_s": cut,
            "edges": frame.height, "train_edges": train.height, "later_edges": later.height,
            "test_edges": test.height, "later_edges_dropped_unknown_account":
                later.height - test.height,
            "users": len(user_ids), "test_users": test["user_id"].n_unique(),
        },
    )
