"""The follow edges an evaluation starts from: a bundled dataset or a user's own edge list.

``dataset_edge_list`` reads a catalogue entry (``recs.demo.datasets``: its file, column order,
separator and time column); ``file_edge_list`` reads any text edge list, one edge per line,
``follower followee [time]`` (``#`` lines skipped; tab, comma or space separated, detected from
the first line unless given; ``reverse`` for files written ``followee follower``; ``time`` in
epoch seconds, fractions allowed). Both drop self-loops and repeated pairs (keeping a pair's
earliest time) and count what they dropped.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from recs.errors import DatasetError

EDGE_SCHEMA = {"follower_id": pl.Int64, "followee_id": pl.Int64, "followed_at": pl.Float64}
"""Columns of ``EdgeList.edges``; ``followed_at`` (epoch seconds) is null without times."""


@dataclass(frozen=True)
class EdgeList:
    """Distinct follow edges, one row per (follower, followee) pair, no self-loops, sorted by
    pair: ``edges`` has ``EDGE_SCHEMA``. ``name``: the dataset name or the file's."""

    name: str
    edges: pl.DataFrame
    self_loops_dropped: int
    duplicates_dropped: int

    @property
    def has_times(self) -> bool:
        """Whether every edge has a ``followed_at`` (so a split by time is possible)."""
        return self.edges.height > 0 and self.edges["followed_at"].null_count() == 0


def _first_data_line(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.strip() and not line.startswith("#"):
                    return line
    except OSError as error:
        raise DatasetError(f"cannot read {path}: {error}") from None
    raise DatasetError(f"{path} holds no edge (every line is empty or a # comment)")


def detect_separator(path: Path) -> str:
    """Tab, comma or space: the first of them found in the first data line of ``path``."""
    line = _first_data_line(path)
    return next((sep for sep in ("\t", ",", " ") if sep in line.strip()), "\t")


def read_edge_list(
    path: Path,
    *,
    name: str | None = None,
    separator: str | None = None,
    reverse: bool = False,
    time_column: int | None = None,
) -> EdgeList:
    """Parse an edge list (module docstring). ``time_column``: 0-based column of the time,
    ``None`` for none. Raises ``DatasetError`` for a missing or unreadable file, ids that are
    not non-negative integers, or times that are not numbers."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"edge list not found: {path}")
    separator = separator or detect_separator(path)
    columns = [0, 1] if time_column is None else [0, 1, time_column]
    try:
        raw = pl.read_csv(
            path, separator=separator, has_header=False, comment_prefix="#", columns=columns,
            infer_schema=False,
        )
        names = ["left", "right", "followed_at"][: raw.width]
        raw = raw.rename(dict(zip(raw.columns, names, strict=True))).with_columns(
            pl.col("left", "right").str.strip_chars().cast(pl.Int64),
            *(
                [pl.col("followed_at").str.strip_chars().cast(pl.Float64)]
                if time_column is not None else []
            ),
        )
    except Exception as error:  # polars: ComputeError, InvalidOperationError, ...
        text = str(error).strip()
        first = text.splitlines()[0] if text else repr(error)
        raise DatasetError(
            f"{path} does not parse as 'follower followee{' time' if time_column else ''}' "
            f"lines: {first}"
        ) from None
    if raw.select(pl.col("left", "right").null_count()).sum_horizontal().item():
        raise DatasetError(f"{path} has lines with a missing id")
    if raw.height and min(raw["left"].min(), raw["right"].min()) < 0:
        raise DatasetError(f"{path} has a negative node id; user ids must be >= 0")
    if time_column is None:
        raw = raw.with_columns(pl.lit(None, dtype=pl.Float64).alias("followed_at"))
    elif raw["followed_at"].null_count():
        raise DatasetError(f"{path} has lines without a time in column {time_column}")
    follower, followee = ("right", "left") if reverse else ("left", "right")
    pairs = raw.select(
        pl.col(follower).alias("follower_id"), pl.col(followee).alias("followee_id"),
        "followed_at",
    )
    loops = pairs["follower_id"] == pairs["followee_id"]
    pairs = pairs.filter(~loops)
    distinct = (
        pairs.group_by("follower_id", "followee_id")
        .agg(pl.col("followed_at").min())
        .sort("follower_id", "followee_id")
        .select(list(EDGE_SCHEMA))
    )
    return EdgeList(
        name=name or path.name.split(".")[0],
        edges=distinct,
        self_loops_dropped=int(loops.sum()),
        duplicates_dropped=pairs.height - distinct.height,
    )


def dataset_edge_list(name: str, settings) -> EdgeList:
    """The edges of catalogue dataset ``name`` (``recs.demo.datasets.dataset_spec`` and
    ``dataset_path``, so its file is found wherever the catalogue keeps it). Raises
    ``DatasetError`` for an unknown name or a missing file."""
    from recs.demo.datasets import dataset_path, dataset_spec

    spec = dataset_spec(name)
    return read_edge_list(
        dataset_path(name, settings), name=name, separator=spec.separator, reverse=spec.reverse,
        time_column=spec.time_column,
    )
