"""The bundled real follow graphs (``datasets/`` in the repository): catalogue, parsing, loading.

``DATASETS`` lists each file and how to read it (the Twitter files are "followee follower":
reversed). ``load_dataset`` parses one (``#`` lines skipped, self-loops and duplicate pairs
dropped and counted), loads every edge unchanged as an ``active`` follow and generates what the
files lack (``recs.demo.generated``: account ages, activity, status, privacy, blocks, mutes,
dismissals, pending requests, interest tags) deterministically from ``DATASET_SEED``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from recs.arrays import sorted_unique
from recs.config import Settings
from recs.demo.follow_graph import FollowGraph
from recs.demo.generated import DATASET_SEED, load_graph
from recs.errors import DatasetError
from recs.store.bulk import ProgressCallback

log = logging.getLogger("recs.demo.datasets")

@dataclass(frozen=True)
class DatasetSpec:
    """One real graph file: ``reverse`` if its columns are (followee, follower);
    ``time_column``: the 0-based column holding each edge's time (epoch seconds), if any."""

    name: str
    filename: str
    description: str
    reverse: bool = False
    separator: str = "\t"
    time_column: int | None = None


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "slashdot",
            "soc-Slashdot0902.txt.gz",
            "SNAP soc-Slashdot0902 (Slashdot Zoo friend/foe tags, Feb 2009): 82,168 users, "
            "870,161 follows after dropping 78,303 self-loops",
        ),
        DatasetSpec(
            "twitter-bofa",
            "twitter-followers-bofa_careers.tsv.gz",
            "Twitter follow graph among the followers of @bofa_careers (Anwar et al., WSDM "
            "2021): 13,688 users, 68,328 follows; columns reversed (file is followee, follower)",
            reverse=True,
        ),
        DatasetSpec(
            "twitter-hershey",
            "twitter-followers-hersheycareers.tsv.gz",
            "Twitter follow graph among the followers of @hersheycareers (Anwar et al., WSDM "
            "2021): 3,726 users, 23,939 follows; columns reversed (file is followee, follower)",
            reverse=True,
        ),
        DatasetSpec(
            "bitcoin-otc",
            "soc-sign-bitcoinotc.csv.gz",
            "SNAP soc-sign-bitcoin-otc (who-trusts-whom among Bitcoin OTC traders, signed "
            "ratings, 2010-2016): 5,881 users, 35,592 rated edges, each with its time",
            separator=",",
            time_column=3,
        ),
    )
}


def dataset_spec(name: str) -> DatasetSpec:
    """The registry entry of ``name``; ``DatasetError`` naming the available ones if unknown."""
    try:
        return DATASETS[name]
    except KeyError:
        raise DatasetError(
            f"unknown dataset {name!r}: available datasets are {', '.join(DATASETS)}"
        ) from None


BUNDLED_DATASETS = Path(__file__).resolve().parents[3] / "datasets"
"""The repository's own ``datasets/`` (the files and their provenance: its README.md)."""
SHARED_DATASETS = BUNDLED_DATASETS.parents[1] / "shared" / "datasets"
"""``../shared/datasets`` beside the repository: an optional extra, searched last."""


def dataset_folders(settings: Settings) -> list[Path]:
    """Where dataset files are looked for, in order: ``settings.datasets_dir``
    (``RECS_DATASETS_DIR``), the bundled ``datasets/``, then ``../shared/datasets``."""
    folders: list[Path] = []
    for folder in (Path(settings.datasets_dir), BUNDLED_DATASETS, SHARED_DATASETS):
        if folder not in folders:
            folders.append(folder)
    return folders


def dataset_path(name: str, settings: Settings) -> Path:
    """The file of dataset ``name`` in the first of ``dataset_folders`` holding it;
    ``DatasetError`` naming every folder searched if none does."""
    spec = dataset_spec(name)
    folders = dataset_folders(settings)
    for folder in folders:
        path = folder / spec.filename
        if path.is_file():
            return path
    raise DatasetError(
        f"dataset file {spec.filename} not found in {', '.join(map(str, folders))} (set "
        f"RECS_DATASETS_DIR to the folder holding it)"
    )


@dataclass(frozen=True)
class DatasetEdges:
    """The parsed follow edges of a dataset file, in follow order (follower -> followee).

    ``edges``: ``follower_id`` Int64, ``followee_id`` Int64, one row per distinct pair, no
    self-loops, sorted by (follower_id, followee_id). ``user_ids``: every node id of the file
    (including nodes whose only edges were self-loops), sorted, int64.
    """

    edges: pl.DataFrame
    user_ids: np.ndarray
    lines: int
    self_loops_dropped: int
    duplicates_dropped: int


def read_edges(name: str, settings: Settings) -> DatasetEdges:
    """Parse dataset ``name``: skip ``#`` lines, reverse if the spec says so, drop self-loops.

    Raises ``DatasetError`` for an unknown name, a missing file, a line that is not two
    integers, or a negative id (the store's user ids are non-negative).
    """
    spec = dataset_spec(name)
    path = dataset_path(name, settings)
    try:
        raw = pl.read_csv(
            path,
            separator=spec.separator,
            has_header=False,
            comment_prefix="#",
            columns=[0, 1],  # a file with more columns (bitcoin-otc: rating, time) keeps two
        )
        raw = raw.rename(dict(zip(raw.columns, ["left", "right"], strict=False))).cast(pl.Int64)
    except Exception as error:  # polars raises ComputeError / NoDataError / ...
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise DatasetError(f"{path} does not parse as two integer columns: {first_line}") from None
    if raw.width != 2:
        raise DatasetError(f"{path} has {raw.width} columns per line, expected 2")
    if raw.null_count().sum_horizontal().item():
        raise DatasetError(f"{path} has lines with a missing id")
    follower, followee = ("right", "left") if spec.reverse else ("left", "right")
    pairs = raw.select(pl.col(follower).alias("follower_id"), pl.col(followee).alias("followee_id"))
    if pairs.height and min(pairs["follower_id"].min(), pairs["followee_id"].min()) < 0:
        raise DatasetError(f"{path} has a negative node id; user ids must be >= 0")
    user_ids = sorted_unique(
        np.concatenate([pairs["follower_id"].to_numpy(), pairs["followee_id"].to_numpy()])
    )
    loops = pairs["follower_id"] == pairs["followee_id"]
    self_loops = int(loops.sum())
    pairs = pairs.filter(~loops)
    distinct = pairs.unique().sort(["follower_id", "followee_id"])
    return DatasetEdges(
        edges=distinct,
        user_ids=user_ids,
        lines=raw.height,
        self_loops_dropped=self_loops,
        duplicates_dropped=pairs.height - distinct.height,
    )


def load_dataset(
    name: str,
    settings: Settings,
    *,
    replace: bool = False,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Load dataset ``name`` plus its generated fields into the live store.

    Every edge of the file becomes an ``active`` follow (columns reversed for the Twitter
    files, self-loops and exact duplicates dropped and counted); the fields in
    ``GENERATED_FIELDS`` are generated from ``DATASET_SEED``. Returns a JSON-able summary:
    ``dataset, path, users, follow_edges`` (active, from the file), ``pending_follows`` (extra
    generated rows), ``self_loops_dropped, duplicates_dropped, blocks, mutes, dismissals,
    interests, users_by_status, new_accounts_24h, dormant_30d, generated_fields,
    reference_date, seed, store, seconds`` (wall time, s) and ``timings`` (s per step).

    Raises ``DatasetError`` for an unknown name, a missing or malformed file, or a non-empty
    live store without ``replace`` (``replace=True`` drops and recreates every table).
    """
    started = time.perf_counter()
    parsed = read_edges(name, settings)
    parse_seconds = time.perf_counter() - started
    log.info(
        "parsed %s: %d lines, %d self-loops and %d duplicates dropped, %d follows, %d users",
        name,
        parsed.lines,
        parsed.self_loops_dropped,
        parsed.duplicates_dropped,
        parsed.edges.height,
        len(parsed.user_ids),
    )
    graph = FollowGraph.from_edges(
        parsed.user_ids,
        parsed.edges["follower_id"].to_numpy(),
        parsed.edges["followee_id"].to_numpy(),
    )
    summary = load_graph(graph, settings, seed=DATASET_SEED, replace=replace, progress=progress)
    summary["timings"] = {"parse": round(parse_seconds, 3), **summary["timings"]}
    return {
        "dataset": name,
        "path": str(dataset_path(name, settings)),
        "self_loops_dropped": parsed.self_loops_dropped,
        "duplicates_dropped": parsed.duplicates_dropped,
        **summary,
        "seconds": round(time.perf_counter() - started, 3),
    }
