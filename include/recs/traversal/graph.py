"""The run's capped follow graph: a read-only CSR adjacency (ARCHITECTURE §3, "capped CSR").

Only second-hop lists need the whole graph, each capped at ``hop2_cap``: ``build_graph`` stores
every account's first ``hop2_cap`` active follows in sample order (``recs.sampling``) once per
run under ``paths.graph_dir``; every shard task memory-maps it read-only (``load_graph``), so
they share it through the page cache and keep no private O(n_nodes) state::

    user_ids.npy   int64[n_nodes]      sorted original user ids; dense id = position
    indptr.npy     int64[n_nodes + 1]  row u is indices[indptr[u]:indptr[u + 1]]
    indices.npy    int32[n_edges]      dense followee ids, each row in sample order
    activity.npy   float64[n_nodes]    ``ranking.activity_term`` per account; NaN if it is not
                                       recommendable (``predicates.recommendable_profiles``)
    recommendable.npy  uint8[ceil(n_nodes / 8)]  the same "not NaN" as one bit per account
                                       (``predicates.recommendable_bits``)
    account_active.npy  bool[n_nodes]  the account's status is ``active`` (only those are first
                                       hops: ``inputs.shard_inputs``)
    path_weight.npy  float64[n_nodes]  weight of a mutual path through the account
                                       (``ranking.path_weights`` of its follows and followers)
    in_degree.npy  int32[n_nodes]      its followers (``candidate_profiles.in_degree``): the
                                       popularity term, the hub damping, the popularity order
    reciprocal_pairs.npy  uint64[...]  sorted ``hop_order.pair_codes`` of the active follows
                                       followed back (empty unless an order is reciprocity)
    id_index.npy   original id -> dense id (``ids.DenseIndex``: a table or a hash table)
    meta.json      counts and the settings the graph was built with

The node universe is ``snapshot/users.parquet``; follow edges come from
``snapshot/follow_edges`` (not ``active``: not expanded; an endpoint missing from ``users``,
self-follows and duplicate pairs: dropped and counted in ``meta.json``), the activity and
followers from the dbt export ``exports/candidate_profiles.parquet`` (so it runs after
``build_models``). The rows are capped and cut in ``hop2_order`` partition by partition into
pieces (``graph_pieces``: mapped ``cap_graph`` tasks, or ``build_graph`` in one process,
``capped_rows.GRAPH_THREADS`` files at a time), then assembled (``assemble_graph``): a task's
peak memory is its files' edges, or the largest piece, plus ``n_nodes`` arrays. Errors:
``RunNotFoundError``, ``SchemaMismatchError``, ``StaleGraphError``, ``StalePieceError``.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recs.errors import CorruptFileError, RecsError, RunNotFoundError, SchemaMismatchError
from recs.files import read_json, read_parquet, sha256_file, write_json
from recs.traversal import in_degree_check
from recs.traversal.capped_rows import EdgeCounts, assemble_rows
from recs.traversal.graph_pieces import (
    GraphContext,
    cap_pieces,
    graph_context,
    piece_dir,
    pieces_dir,
    plan_pieces,
    planned_pieces,
    save_npy,
)
from recs.traversal.ids import DenseIndex
from recs.traversal.predicates import recommendable_bits, recommendable_profiles
from recs.traversal.ranking import activity_term, path_weights

log = logging.getLogger("recs.graph")

GRAPH_FILES = (
    "user_ids.npy", "indptr.npy", "indices.npy", "activity.npy", "recommendable.npy",
    "account_active.npy", "path_weight.npy", "in_degree.npy", "reciprocal_pairs.npy",
    "id_index.npy", "meta.json",
)
#: 2: adds activity.npy and id_index.npy; 3: adds account_active.npy; 4: path_weight.npy,
#: in_degree.npy, reciprocal_pairs.npy and the hop2 order; 5: recommendable.npy (older graphs:
#: rebuild).
GRAPH_FORMAT_VERSION = 5


class StaleGraphError(RecsError):
    """The run's graph was built with other settings (``hop2_cap``, ``sample_seed``,
    ``half_life_days``, ``ranking``, ``hop2_order``) or for another ``as_of``."""


def smallest_hub_in_degree(hubs_path: Path) -> int:
    """The smallest ``in_degree`` of ``hub_accounts.parquet`` (0 if no hub or no file): the hub
    damping's reference audience."""

    if not Path(hubs_path).exists():
        return 0
    degrees = read_parquet(hubs_path, ["in_degree"])["in_degree"].drop_nulls()
    return int(degrees.min()) if len(degrees) else 0


def candidate_activity(
    profiles_path: Path,
    index: DenseIndex,
    n_nodes: int,
    as_of: dt.datetime,
    half_life_days: float,
) -> np.ndarray:
    """Per-node candidate signal from ``candidate_profiles.parquet``: ``float64[n_nodes]``.

    ``ranking.activity_term`` at ``as_of`` (naive UTC) for the accounts
    ``predicates.recommendable_profiles`` keeps; NaN for every other account and for one with no
    profile row, so one array answers both "may it be recommended" and "what is its activity
    term". Read in record batches of 1 M rows. Raises ``RunNotFoundError`` if the file is
    missing.
    """
    import polars as pl
    import pyarrow.parquet as pq

    profiles_path = Path(profiles_path)
    if not profiles_path.exists():
        raise RunNotFoundError(f"missing export {profiles_path}: run build_models first")
    activity = np.full(n_nodes, np.nan, dtype=np.float64)
    activity_expr = activity_term(as_of, half_life_days)
    columns = ["candidate_id", "is_recommendable", "last_active_at"]
    for batch in pq.ParquetFile(profiles_path).iter_batches(batch_size=1 << 20, columns=columns):
        frame = (
            pl.from_arrow(batch)
            .with_columns(pl.col("last_active_at").cast(pl.Datetime("us")))
            .filter(recommendable_profiles())
            .select(pl.col("candidate_id").cast(pl.Int64), activity_expr.alias("activity"))
        )
        dense = index(frame["candidate_id"].to_numpy())
        known = dense >= 0
        activity[dense[known]] = frame["activity"].to_numpy()[known]
    return activity


def account_active(users_path: Path, index: DenseIndex, n_nodes: int) -> np.ndarray:
    """``bool[n_nodes]``: whether each account's ``account_status`` in ``users.parquet`` is
    ``active`` (suspended and deactivated accounts are not expanded as anyone's first hop)."""

    frame = read_parquet(users_path, ["user_id", "account_status"])
    active = np.zeros(n_nodes, dtype=np.bool_)
    dense = index(frame["user_id"].to_numpy())
    known = dense >= 0
    active[dense[known]] = (frame["account_status"] == "active").fill_null(False).to_numpy()[known]
    return active


def build_graph(paths, settings) -> dict[str, Any]:
    """Build the run's capped CSR graph in one process: ``graph_pieces.plan_pieces``, every
    partition's ``cap_pieces`` (``GRAPH_THREADS`` files at once), then ``assemble_graph``. The
    night's DAG runs the same three as ``plan_graph``, mapped ``cap_graph`` tasks and
    ``build_graph``: the bytes are the same.

    Reads ``paths.snapshot_dir / "users.parquet"`` (``user_id`` Int64) and every
    ``follow_edges/shard_id=*/part-*.parquet`` (contract ``SNAPSHOT_SCHEMAS["follow_edges"]``).
    Returns what ``assemble_graph`` returns; raises what the three raise.
    """
    started = time.perf_counter()
    plan = plan_pieces(paths, settings)
    context = graph_context(paths, settings)
    cap_pieces(paths, settings, plan["partitions"], context)
    return assemble_graph(paths, settings, context, started=started)


def assemble_graph(
    paths, settings, context: GraphContext | None = None, *, started: float | None = None
) -> dict[str, Any]:
    """Assemble the run's capped CSR graph from its pieces (``graph_pieces``) under
    ``paths.graph_dir``: the files listed in the module docstring, each atomically, identical
    bytes on rerun. Row ``u`` holds ``u``'s first ``settings.hop2_cap`` active follows in
    ``settings.hop2_order`` (sample order: ``settings.sample_seed``).

    Also writes ``activity.npy`` (``candidate_activity`` of ``exports/candidate_profiles.parquet``
    at ``paths.as_of`` and ``settings.half_life_days``), ``in_degree.npy`` (its ``in_degree``),
    ``path_weight.npy`` (``ranking.path_weights`` of ``settings.ranking`` over each account's
    active follows and its followers), ``reciprocal_pairs.npy`` (the plan's) and
    ``id_index.npy``.

    Once the graph is written the pieces are removed (their arrays take twice ``indices.npy``);
    a run store keeps its copies until ``recs gc`` removes the run there. Assembling again (a
    cleared ``build_graph``, a retry after the removal or killed during it) keeps the graph this
    plan was assembled into if it is whole (``_assembled_from_plan``), else needs every piece.
    Returns ``{"graph_dir", "n_nodes", "n_edges", "seconds",
    **meta counts}``.
    Raises ``RunNotFoundError`` if ``users.parquet``, ``in_degrees.parquet``, the plan or the
    candidate profiles export is missing, ``StalePieceError`` naming the partitions whose pieces
    are missing or stale, ``in_degree_check.InDegreeMismatchError`` (a ``CorruptFileError``) if
    the snapshot's in-degrees do not match its follow edges (before anything is written) and
    ``SchemaMismatchError`` if ``user_id`` is not Int64.
    """
    started = time.perf_counter() if started is None else started
    context = context or graph_context(paths, settings)
    users_path = Path(paths.snapshot_dir) / "users.parquet"
    user_ids, index, in_degree = context.user_ids, context.index, context.in_degree
    n_nodes = context.n_nodes
    graph_dir = Path(paths.graph_dir)
    plan_sha256 = sha256_file(pieces_dir(paths) / "plan.json")
    kept = _assembled_from_plan(graph_dir, plan_sha256)
    if kept is not None:
        log.info("graph %s: assembled from this plan already: kept", graph_dir)
        return {"graph_dir": str(graph_dir), "seconds": round(time.perf_counter() - started, 3),
                **kept}  # fmt: skip
    pieces = list(planned_pieces(paths, context.plan))  # refuses missing and stale ones first
    counts = EdgeCounts(partitions=list(context.plan["partitions"]))
    read = EdgeCounts()
    for piece in pieces:
        read.add(piece.counts)
    in_degree_check.check(paths, read)  # before anything is written

    graph_dir.mkdir(parents=True, exist_ok=True)
    (graph_dir / "meta.json").unlink(missing_ok=True)  # a graph half rewritten is not built
    # what a killed attempt left (the run's lock is held: no other build is running)
    for leftover in graph_dir.glob(".*.tmp"):
        leftover.unlink(missing_ok=True)
    indptr, degree, out_degree, n_edges = assemble_rows(
        pieces, index, n_nodes, counts, context.row_order, settings, graph_dir / "indices.npy"
    )

    as_of = paths.as_of.astimezone(dt.UTC).replace(tzinfo=None)
    profiles_path = Path(paths.exports_dir) / "candidate_profiles.parquet"
    activity = candidate_activity(profiles_path, index, n_nodes, as_of, settings.half_life_days)
    weights = path_weights(settings.ranking, out_degree, in_degree)
    hub_in_degree = smallest_hub_in_degree(Path(paths.exports_dir) / "hub_accounts.parquet")
    id_array, id_spec = index.saved()

    save_npy(graph_dir / "user_ids.npy", user_ids.astype(np.int64))
    save_npy(graph_dir / "indptr.npy", indptr)
    save_npy(graph_dir / "activity.npy", activity)
    save_npy(graph_dir / "recommendable.npy", recommendable_bits(activity))
    active_accounts = account_active(users_path, index, n_nodes)
    save_npy(graph_dir / "account_active.npy", active_accounts)
    save_npy(graph_dir / "path_weight.npy", weights)
    save_npy(graph_dir / "in_degree.npy", in_degree)
    save_npy(graph_dir / "reciprocal_pairs.npy", context.reciprocal_codes)
    save_npy(graph_dir / "id_index.npy", id_array)
    meta = {
        "format_version": GRAPH_FORMAT_VERSION,
        "n_nodes": int(n_nodes),
        "n_edges": n_edges,
        "hop2_cap": int(settings.hop2_cap),
        "sample_seed": int(settings.sample_seed),
        "as_of": as_of.isoformat(),
        "half_life_days": float(settings.half_life_days),
        "ranking": settings.ranking,
        "hop2_order": settings.hop2_order,
        "reciprocity": bool(context.plan["reciprocity"]),
        "max_in_degree": int(in_degree.max()) if n_nodes else 0,
        "hub_in_degree": hub_in_degree,
        "recommendable_nodes": int(np.count_nonzero(~np.isnan(activity))),
        "active_accounts": int(np.count_nonzero(active_accounts)),
        "id_index": id_spec,
        "edges_read": counts.edges_read,
        "pending_skipped": counts.pending_skipped,
        "unknown_endpoint_dropped": counts.unknown_endpoint_dropped,
        "self_loops_dropped": counts.self_loops_dropped,
        "duplicates_dropped": counts.duplicates_dropped,
        "rows_capped": counts.rows_capped,
        "max_row_length": int(degree.max()) if n_nodes else 0,
        "partitions": counts.partitions,
        "plan_sha256": plan_sha256,
        "file_sizes": {
            name: (graph_dir / name).stat().st_size for name in GRAPH_FILES if name != "meta.json"
        },
    }
    write_json(graph_dir / "meta.json", meta)
    for shard_id in context.plan["partitions"]:  # scratch, 2x indices.npy: built, not needed
        shutil.rmtree(piece_dir(paths, shard_id), ignore_errors=True)
    seconds = round(time.perf_counter() - started, 3)
    log.info(
        "graph: %d nodes, %d capped edges (%d read, %d pending, %d unknown endpoint) in %.1fs",
        n_nodes, n_edges, counts.edges_read, counts.pending_skipped,
        counts.unknown_endpoint_dropped, seconds,
    )
    return {"graph_dir": str(graph_dir), "seconds": seconds, **meta}


def _assembled_from_plan(graph_dir: Path, plan_sha256: str) -> dict[str, Any] | None:
    """The ``meta.json`` of ``graph_dir`` if it holds the graph the plan whose ``plan.json`` has
    ``plan_sha256`` was assembled into, whole, else None: ``meta.json`` (written last by an
    assembly, removed first by the next one and by ``plan_pieces``) names this plan and this
    format, and every other graph file has the size it records. The pieces play no part: they
    would give the same bytes, and the assembly removes them after ``meta.json``."""
    try:
        meta = read_json(graph_dir / "meta.json")
    except (RunNotFoundError, CorruptFileError):
        return None
    sizes = meta.get("file_sizes")
    if (
        meta.get("format_version") != GRAPH_FORMAT_VERSION
        or meta.get("plan_sha256") != plan_sha256
        or not isinstance(sizes, dict)
        or set(sizes) != set(GRAPH_FILES) - {"meta.json"}
    ):
        return None
    for name, size in sizes.items():
        path = graph_dir / name
        if not path.is_file() or path.stat().st_size != size:
            return None
    return meta


@dataclass(frozen=True)
class CappedGraph:
    """A memory-mapped, read-only capped CSR graph (see the module docstring for the arrays).

    ``user_ids`` int64[n_nodes], ``indptr`` int64[n_nodes + 1], ``indices`` int32[n_edges],
    ``activity`` float64[n_nodes], ``recommendable`` uint8[ceil(n_nodes / 8)],
    ``account_active`` bool[n_nodes], ``path_weight`` float64[n_nodes], ``in_degree``
    int32[n_nodes], ``reciprocal_pairs`` uint64 and the arrays behind ``index`` (the id map):
    all ``np.memmap`` opened read-only, shared through the page cache, never copied.
    """

    user_ids: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    activity: np.ndarray
    account_active: np.ndarray
    index: DenseIndex
    meta: dict[str, Any]
    path_weight: np.ndarray | None = None
    in_degree: np.ndarray | None = None
    reciprocal_pairs: np.ndarray | None = None
    recommendable: np.ndarray | None = None

    @property
    def n_nodes(self) -> int:
        return len(self.user_ids)

    @property
    def n_edges(self) -> int:
        return len(self.indices)

    def dense_ids(self, ids) -> np.ndarray:
        """Dense ids (``int32``) of original user ids; ``-1`` for ids not in the graph."""
        return self.index(ids)

    def follows(self, user_id: int) -> list[int]:
        """Original ids of one user's capped row, in sample order (``[]`` if unknown)."""
        dense = int(self.dense_ids([user_id])[0])
        if dense < 0:
            return []
        row = self.indices[self.indptr[dense] : self.indptr[dense + 1]]
        return [int(v) for v in self.user_ids[row]]


def load_graph(graph_dir: Path) -> CappedGraph:
    """Memory-map the graph written by ``build_graph`` (``np.load(mmap_mode="r")``).

    Raises ``RunNotFoundError`` naming a missing file and ``SchemaMismatchError`` if the
    arrays' dtypes or lengths disagree with ``meta.json``.
    """
    graph_dir = Path(graph_dir)
    for name in GRAPH_FILES:
        if not (graph_dir / name).exists():
            raise RunNotFoundError(
                f"missing graph file {graph_dir / name}: the run's build_graph has not "
                "finished (`recs run` with its date and run id, or the DAG run, makes it)"
            )
    meta = read_json(graph_dir / "meta.json")
    if meta.get("format_version") != GRAPH_FORMAT_VERSION:
        raise SchemaMismatchError(
            f"graph {graph_dir} has format {meta.get('format_version')}, this version reads "
            f"{GRAPH_FORMAT_VERSION}: rerun build_graph"
        )

    def mapped(name: str) -> np.ndarray:
        try:
            return np.load(graph_dir / name, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as error:  # a cut or overwritten file
            reason = " ".join(str(error).split())[:200] or type(error).__name__
            raise CorruptFileError(
                f"graph file {graph_dir / name} is unreadable ({reason}): rerun build_graph"
            ) from None

    user_ids, indptr, indices = mapped("user_ids.npy"), mapped("indptr.npy"), mapped("indices.npy")
    activity, id_array = mapped("activity.npy"), mapped("id_index.npy")
    active_accounts = mapped("account_active.npy")
    weights, in_degree = mapped("path_weight.npy"), mapped("in_degree.npy")
    reciprocal_codes, bits = mapped("reciprocal_pairs.npy"), mapped("recommendable.npy")
    problems = []
    if user_ids.dtype != np.int64 or len(user_ids) != meta["n_nodes"]:
        problems.append(f"user_ids {user_ids.dtype}[{len(user_ids)}]")
    if indptr.dtype != np.int64 or len(indptr) != meta["n_nodes"] + 1:
        problems.append(f"indptr {indptr.dtype}[{len(indptr)}]")
    if indices.dtype != np.int32 or len(indices) != meta["n_edges"]:
        problems.append(f"indices {indices.dtype}[{len(indices)}]")
    if activity.dtype != np.float64 or len(activity) != meta["n_nodes"]:
        problems.append(f"activity {activity.dtype}[{len(activity)}]")
    if active_accounts.dtype != np.bool_ or len(active_accounts) != meta["n_nodes"]:
        problems.append(f"account_active {active_accounts.dtype}[{len(active_accounts)}]")
    if weights.dtype != np.float64 or len(weights) != meta["n_nodes"]:
        problems.append(f"path_weight {weights.dtype}[{len(weights)}]")
    if in_degree.dtype != np.int32 or len(in_degree) != meta["n_nodes"]:
        problems.append(f"in_degree {in_degree.dtype}[{len(in_degree)}]")
    if bits.dtype != np.uint8 or len(bits) != (meta["n_nodes"] + 7) // 8:
        problems.append(f"recommendable {bits.dtype}[{len(bits)}]")
    if reciprocal_codes.dtype != np.uint64:
        problems.append(f"reciprocal_pairs {reciprocal_codes.dtype}")
    if problems:
        raise SchemaMismatchError(f"graph {graph_dir} is inconsistent with meta.json: {problems}")
    out_of_range = _out_of_range(indptr, indices, id_array, meta)
    if out_of_range:
        raise CorruptFileError(
            f"graph {graph_dir} holds ids out of range ({'; '.join(out_of_range)}): the files "
            "were damaged after the build; rerun build_graph"
        )
    index = DenseIndex.from_saved(user_ids, id_array, meta["id_index"])
    return CappedGraph(
        user_ids=user_ids, indptr=indptr, indices=indices, activity=activity,
        account_active=active_accounts, index=index, meta=meta, path_weight=weights,
        in_degree=in_degree, reciprocal_pairs=reciprocal_codes, recommendable=bits,
    )


def _out_of_range(indptr, indices, id_array, meta) -> list[str]:
    """What the compiled kernel would read out of bounds (it checks nothing, so a damaged file
    would crash the process): ``indptr`` from 0 to ``n_edges`` without going back, every
    ``indices`` entry and every id-table value a dense id. One pass over each: 20-40 ms on the
    1 M users' graph (four calls), against a task of seconds."""
    n_nodes, n_edges = meta["n_nodes"], meta["n_edges"]
    problems = []
    if len(indptr) and (indptr[0] != 0 or indptr[-1] != n_edges or (np.diff(indptr) < 0).any()):
        problems.append("indptr")
    if n_edges and (int(indices.min()) < 0 or int(indices.max()) >= n_nodes):
        problems.append("indices")
    if meta["id_index"].get("kind") == "table" and len(id_array):
        if int(id_array.min()) < -1 or int(id_array.max()) >= n_nodes:
            problems.append("id_index")
    elif meta["id_index"].get("kind") == "hash" and id_array.size:
        positions = id_array[1]
        if int(positions.min()) < -1 or int(positions.max()) >= n_nodes:
            problems.append("id_index")
    return problems


def check_built_for(graph: CappedGraph, settings, as_of: dt.datetime, graph_dir: Path) -> None:
    """Raise ``StaleGraphError`` unless ``graph`` was built for this run: ``as_of`` (naive UTC),
    ``sample_seed``, ``half_life_days``, ``ranking`` and ``hop2_order`` equal, reciprocity codes
    if ``hop1_order`` needs them, ``hop2_cap`` at least the settings' (a smaller cap reads a
    prefix of every row, which is the same sample)."""
    built = graph.meta
    wanted = {
        "sample_seed": settings.sample_seed, "half_life_days": float(settings.half_life_days),
        "as_of": as_of.isoformat(), "ranking": settings.ranking,
        "hop2_order": settings.hop2_order,
    }
    if settings.hop1_order == "reciprocity":
        wanted["reciprocity"] = True
    if built["hop2_cap"] < settings.hop2_cap or any(built[k] != v for k, v in wanted.items()):
        have = ", ".join(f"{k}={built[k]}" for k in ("hop2_cap", *wanted))
        need = ", ".join(f"{k}={v}" for k, v in wanted.items())
        raise StaleGraphError(
            f"graph {graph_dir} was built with {have}; this run needs hop2_cap="
            f"{settings.hop2_cap} (or more), {need}: rerun build_graph"
        )
