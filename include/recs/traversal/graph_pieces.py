"""The capped graph built partition by partition: a plan, one piece per snapshot partition, then
the assembly (``graph.assemble_graph``), so the night's DAG spreads the capping over workers.

``plan_pieces`` writes ``graph_pieces/plan.json`` (the partitions with their files and rows
from the snapshot manifest, the inputs every piece must be computed from, and a ``plan_id``
new with each plan, so no two plans share bytes and a worker keeps a graph only for the plan
that assembled it) and
``reciprocal_pairs.npy`` (the follows followed back, when ``hop1_order`` or ``hop2_order`` is
``reciprocity``: one pass over every partition, 8 bytes per follow; empty otherwise).
``cap_pieces`` caps the follows of some partitions (``capped_rows``, ``GRAPH_THREADS`` files at
once) into ``graph_pieces/shard_id=NNN/``, one set per Parquet file ``iii`` of it::

    iii.src.npy  int32[k]   dense follower of each capped follow, rows in ``hop2_order``
    iii.dst.npy  int32[k]   dense followee
    iii.followers.npy  int32[f]   the followers with an active follow in the file
    iii.out_degree.npy int64[f]   each one's distinct active follows, uncapped
    piece.json   the plan's inputs, the files, their ``EdgeCounts`` and each array's size in
                 bytes (written last, durably)

A piece counts only through its ``piece.json`` with the plan's ``inputs`` (the snapshot
manifest's sha256, ``hop2_cap``, ``sample_seed``, ``hop2_order``, whether an order needs the
pairs followed back), the manifest's rows read, and arrays of the sizes it records: any other
is stale and the assembly refuses it, naming the partitions to cap again. A partition whose
files hold other rows than the manifest's is refused when capped. The arrays are written
atomically but not fsynced (scratch for the assembly; their fsyncs cost 0.3-0.5 s of the 1 M
users' capping, ``bench/README.md``): the size check catches one a crash cut short. The
assembly removes the pieces once the graph is written. Memory of a capping task: its id map and
in-degrees (``n_nodes``) plus ``GRAPH_THREADS`` files' follows, never the graph's. Errors:
``RunNotFoundError``, ``CorruptFileError``, ``StalePieceError``.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Iterator
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recs.arrays import sorted_unique
from recs.errors import CorruptFileError, RecsError, RunNotFoundError
from recs.files import atomic_write, read_json, read_parquet, write_json
from recs.sharding import partition_files
from recs.traversal.capped_rows import (
    EdgeCounts,
    RowOrder,
    capped_in_order,
    reciprocal_pair_codes,
)
from recs.traversal.ids import DenseIndex

log = logging.getLogger("recs.graph")

PIECES = "graph_pieces"
#: The arrays of each file of a piece (module docstring).
ARRAYS = ("src", "dst", "followers", "out_degree")
#: 1: one piece per partition, a set of arrays per Parquet file; 2: its counts hold the
#: followee sums ``in_degree_check`` adds up (a format-1 piece is stale: capped again).
PIECE_FORMAT = 2


class StalePieceError(RecsError):
    """A partition's piece is missing, half written, or computed from another snapshot or
    other settings than the run's graph plan."""


def pieces_dir(paths) -> Path:
    return Path(paths.run_dir) / PIECES


def piece_dir(paths, shard_id: int) -> Path:
    return pieces_dir(paths) / f"shard_id={shard_id:03d}"


def piece_array(folder: Path, number: int, name: str) -> Path:
    """``<folder>/<number:03d>.<name>.npy``: array ``name`` (``ARRAYS``) of a piece's file
    ``number``."""
    return Path(folder) / f"{number:03d}.{name}.npy"


def needs_reciprocity(settings) -> bool:
    return "reciprocity" in (settings.hop1_order, settings.hop2_order)


def piece_inputs(paths, settings) -> dict[str, Any]:
    """What every piece of this run is computed from: the snapshot manifest's sha256 (None for a
    snapshot without one) and the settings that cut rows."""
    manifest = Path(paths.snapshot_manifest)
    digest = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.exists() else None
    return {
        "format": PIECE_FORMAT,
        "snapshot_manifest_sha256": digest,
        "hop2_cap": int(settings.hop2_cap),
        "sample_seed": int(settings.sample_seed),
        "hop2_order": settings.hop2_order,
        "reciprocity": needs_reciprocity(settings),
    }


def snapshot_partitions(paths) -> dict[int, dict[str, Any]]:
    """The snapshot's follow-edge partitions, ``{shard_id: {"files": [paths relative to the
    snapshot folder], "rows": n}}``: the manifest's ``follow_edges_shards`` (so a machine
    without the edges can list them, and a file gone from a partition is an error, not an
    empty piece), else the ``shard_id=`` folders found (``rows`` None: a snapshot without a
    manifest, the unit tests')."""
    manifest = Path(paths.snapshot_manifest)
    if manifest.exists():
        listed = read_json(manifest).get("follow_edges_shards")
        if listed is not None:
            found: dict[int, dict[str, Any]] = {}
            for shard in sorted(listed, key=lambda shard: (shard["shard_id"], shard["path"])):
                entry = found.setdefault(int(shard["shard_id"]), {"files": [], "rows": 0})
                entry["files"].append(shard["path"])
                entry["rows"] += int(shard["rows"])
            return found
    snapshot_dir = Path(paths.snapshot_dir)
    return {
        shard_id: {"files": [str(f.relative_to(snapshot_dir)) for f in files], "rows": None}
        for shard_id, files in partition_files(snapshot_dir / "follow_edges").items()
    }


def read_user_ids(users_path: Path) -> np.ndarray:
    """Sorted unique ``user_id`` values of ``users.parquet`` as ``int64`` (the dense id map).
    Raises ``RunNotFoundError`` if the file is missing, ``SchemaMismatchError`` if ``user_id``
    is not Int64."""
    import polars as pl

    from recs.errors import SchemaMismatchError

    if not Path(users_path).exists():
        raise RunNotFoundError(
            f"missing snapshot users file {users_path}: freeze the snapshot first"
        )
    frame = read_parquet(users_path, ["user_id"])
    if frame.schema["user_id"] != pl.Int64:
        raise SchemaMismatchError(f"{users_path}: user_id is {frame.schema['user_id']}, not Int64")
    return sorted_unique(frame["user_id"].drop_nulls().to_numpy())


def profile_in_degrees(profiles_path: Path, index: DenseIndex, n_nodes: int) -> np.ndarray:
    """``int32[n_nodes]``: each account's ``in_degree`` in ``candidate_profiles.parquet`` (0 for
    an account without a row, and for all of them if the export is missing)."""

    in_degree = np.zeros(n_nodes, dtype=np.int32)
    if not Path(profiles_path).exists():
        return in_degree
    frame = read_parquet(profiles_path, ["candidate_id", "in_degree"])
    dense = index(frame["candidate_id"].to_numpy())
    known = dense >= 0
    values = frame["in_degree"].fill_null(0).to_numpy().astype(np.int64)[known]
    in_degree[dense[known]] = np.clip(values, 0, np.iinfo(np.int32).max)
    return in_degree


@dataclass(frozen=True)
class GraphContext:
    """What capping and assembly share: the id map, the in-degrees, the reciprocal pairs, the
    row order and the plan (``plan.json``)."""

    user_ids: np.ndarray
    index: DenseIndex
    in_degree: np.ndarray
    reciprocal_codes: np.ndarray
    row_order: RowOrder
    plan: dict[str, Any]

    @property
    def n_nodes(self) -> int:
        return len(self.user_ids)


def plan_pieces(paths, settings) -> dict[str, Any]:
    """Write the run's graph plan, ``graph_pieces/plan.json`` and ``reciprocal_pairs.npy``
    (module docstring), and withdraw the built graph's ``meta.json`` (it is built again from
    this plan); returns the plan ``{"plan_id", "inputs", "partitions", "files", "rows",
    "reciprocity"}``. ``plan_id`` is new each time: the same snapshot and settings planned again
    (a rerun) give another plan, so a worker whose graph an earlier plan assembled (its
    ``meta.json`` names that plan's sha256) assembles again instead of keeping it (a review's
    second machine kept the first attempt's graph, unchecked against the rerun's in-degrees)."""
    folder = pieces_dir(paths)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").unlink(missing_ok=True)  # a plan half rewritten is no plan
    # and the graph is to be assembled again: until then it does not look built
    (Path(paths.graph_dir) / "meta.json").unlink(missing_ok=True)
    reciprocity = needs_reciprocity(settings)
    codes = np.zeros(0, dtype=np.uint64)
    if reciprocity:
        index = DenseIndex(read_user_ids(Path(paths.snapshot_dir) / "users.parquet"))
        codes = reciprocal_pair_codes(paths.snapshot_dir, index)
    save_npy(folder / "reciprocal_pairs.npy", codes)
    partitions = snapshot_partitions(paths)
    plan = {
        "plan_id": uuid.uuid4().hex,
        "inputs": piece_inputs(paths, settings),
        "partitions": list(partitions),
        "files": {str(shard_id): entry["files"] for shard_id, entry in partitions.items()},
        "rows": {str(shard_id): entry["rows"] for shard_id, entry in partitions.items()},
        "reciprocity": reciprocity,
    }
    write_json(folder / "plan.json", plan)
    return plan


def read_plan(paths, settings) -> dict[str, Any]:
    """The run's graph plan, checked against the run. Raises ``RunNotFoundError`` without one,
    ``StalePieceError`` for one made from another snapshot or other settings."""
    path = pieces_dir(paths) / "plan.json"
    if not path.exists():
        raise RunNotFoundError(f"no graph plan {path}: run plan_graph first")
    plan = read_json(path)
    if plan.get("inputs") != piece_inputs(paths, settings):
        raise StalePieceError(
            f"the graph plan {path} was made from another snapshot or other settings: run "
            "plan_graph again, then cap_graph"
        )
    return plan


def graph_context(paths, settings) -> GraphContext:
    """The id map (``users.parquet``), the in-degrees (``exports/candidate_profiles.parquet``),
    the plan's reciprocal pairs and the row order of ``settings.hop2_order``."""
    plan = read_plan(paths, settings)
    user_ids = read_user_ids(Path(paths.snapshot_dir) / "users.parquet")
    index = DenseIndex(user_ids)
    profiles = Path(paths.exports_dir) / "candidate_profiles.parquet"
    if not profiles.exists():  # the popularity order and the assembly need its in-degrees
        raise RunNotFoundError(f"missing export {profiles}: run build_models first")
    in_degree = profile_in_degrees(profiles, index, len(user_ids))
    codes_path = pieces_dir(paths) / "reciprocal_pairs.npy"
    if not codes_path.exists():
        raise RunNotFoundError(f"no {codes_path}: run plan_graph first")
    codes = np.load(codes_path, allow_pickle=False)
    return GraphContext(
        user_ids=user_ids, index=index, in_degree=in_degree, reciprocal_codes=codes,
        row_order=RowOrder(settings.hop2_order, in_degree, codes), plan=plan,
    )


def save_npy(path: Path, array: np.ndarray, *, durable: bool = True) -> int:
    """``np.save`` through ``atomic_write``: a reader sees the old file or the whole new one.
    Returns the file's size in bytes. ``durable=False``: not fsynced (a piece's arrays, which
    ``piece.json`` records by size)."""
    with atomic_write(path, binary=True, durable=durable) as handle:
        np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
    return Path(path).stat().st_size


def cap_pieces(
    paths, settings, shard_ids: list[int], context: GraphContext | None = None
) -> list[dict[str, Any]]:
    """Cap the follows of partitions ``shard_ids`` into their pieces (module docstring),
    ``GRAPH_THREADS`` files at once, in the given order; each piece's ``piece.json`` is removed
    first and written once its arrays are. Returns ``[{"shard_id", "capped_edges", **counts}]``.
    Raises ``RunNotFoundError`` (no plan, no users file or profiles export, a partition's file
    gone), ``CorruptFileError`` (a file Polars cannot read, a partition holding other rows
    than the manifest's, or a follower of another shard: ``recs.sharding.misfiled``),
    ``StalePieceError`` (a stale plan, or a partition the plan does not list) and
    ``ValueError`` (a partition named twice).
    """
    context = context or graph_context(paths, settings)
    if len(set(shard_ids)) != len(shard_ids):
        raise ValueError(f"partitions repeated in {shard_ids}")
    unplanned = sorted(set(shard_ids) - set(context.plan["partitions"]))
    if unplanned:
        raise StalePieceError(
            f"partitions {unplanned} are not in the run's graph plan "
            f"{context.plan['partitions']}"
        )
    snapshot_dir = Path(paths.snapshot_dir)
    found = {i: [snapshot_dir / f for f in context.plan["files"][str(i)]] for i in shard_ids}
    files = [(shard_id, path) for shard_id in shard_ids for path in found[shard_id]]
    for shard_id in shard_ids:
        folder = piece_dir(paths, shard_id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "piece.json").unlink(missing_ok=True)
        for leftover in folder.iterdir():  # an earlier attempt's arrays, maybe more files
            leftover.unlink()
    capped = capped_in_order(
        files, context.index, int(settings.hop2_cap), settings.sample_seed, context.row_order,
        settings.shard_count,
    )
    results = []
    with closing(capped):  # an error here stops the files still being capped
        done: dict[int, list[tuple]] = {i: [] for i in shard_ids}
        remaining = {i: len(found[i]) for i in shard_ids}
        for shard_id in [i for i in shard_ids if remaining[i] == 0]:
            results.append(_write_piece(paths, shard_id, context.plan, []))
        for (shard_id, path), (src, dst, full, counts) in zip(files, capped, strict=True):
            folder = piece_dir(paths, shard_id)
            followers = np.flatnonzero(full).astype(np.int32)
            arrays = {"src": src, "dst": dst, "followers": followers,
                      "out_degree": full[followers]}
            sizes = {  # not fsynced: a size piece.json does not record makes the piece stale
                name: save_npy(piece_array(folder, len(done[shard_id]), name), array, durable=False)
                for name, array in arrays.items()
            }
            done[shard_id].append((path.name, counts, len(src), sizes))
            log.info("graph partition %s: %d capped edges from %s", shard_id, len(src), path.name)
            del src, dst, full, followers, arrays
            remaining[shard_id] -= 1
            if remaining[shard_id] == 0:
                results.append(_write_piece(paths, shard_id, context.plan, done[shard_id]))
    return results


def _write_piece(paths, shard_id: int, plan: dict[str, Any], files: list[tuple]) -> dict:
    """``piece.json`` of a partition whose arrays are written: ``files`` is ``[(Parquet file
    name, its EdgeCounts, capped edges, {array: size in bytes})]``. Raises
    ``CorruptFileError`` if the files held other than the plan's (the manifest's) rows."""
    counts = EdgeCounts()
    for _, file_counts, _, _ in files:
        counts.add(file_counts)
    rows = plan["rows"][str(shard_id)]
    if rows is not None and counts.edges_read != rows:
        raise CorruptFileError(
            f"partition {shard_id} of run {paths.run_id}: its snapshot files hold "
            f"{counts.edges_read} follow edges, its manifest {rows}: the snapshot was damaged "
            "after its freeze; freeze it again"
        )
    document = {
        "shard_id": shard_id,
        "inputs": plan["inputs"],
        "files": [
            {"name": name, "capped_edges": n, "counts": _counts_dict(file_counts),
             "sizes": sizes}
            for name, file_counts, n, sizes in files
        ],
    }
    write_json(piece_dir(paths, shard_id) / "piece.json", document)
    return {"shard_id": shard_id, "capped_edges": sum(file[2] for file in files),
            **_counts_dict(counts)}


def _counts_dict(counts: EdgeCounts) -> dict[str, int]:
    return {name: value for name, value in asdict(counts).items() if name != "partitions"}


def _whole(paths, shard_id: int, document: dict | None, plan: dict[str, Any]) -> bool:
    """Whether a piece's ``piece.json`` has the plan's ``inputs``, counts the plan's rows
    read, and each of the four arrays of each file it lists is there with its recorded size
    (one ``stat`` each: an array cut short by a crash, which was not fsynced, or rewritten
    with another size, fails; one rewritten with the same size is not caught)."""
    if not isinstance(document, dict) or document.get("inputs") != plan["inputs"]:
        return False
    entries = document.get("files")
    if not isinstance(entries, list):
        return False
    try:
        read = sum(int(entry["counts"]["edges_read"]) for entry in entries)
        sizes = [entry["sizes"] for entry in entries]
    except (KeyError, TypeError, ValueError):
        return False
    rows = plan["rows"][str(shard_id)]
    if rows is not None and read != rows:
        return False
    folder = piece_dir(paths, shard_id)
    for number, recorded in enumerate(sizes):
        if not isinstance(recorded, dict) or sorted(recorded) != sorted(ARRAYS):
            return False
        for name, size in recorded.items():
            path = piece_array(folder, number, name)
            if not path.exists() or path.stat().st_size != size:
                return False
    return True


@dataclass(frozen=True)
class PieceFile:
    """One Parquet file's capped follows in a piece (``load`` each array when needed)."""

    shard_id: int
    src: Path
    dst: Path
    followers: Path
    out_degree: Path
    counts: EdgeCounts


def planned_pieces(paths, plan: dict[str, Any]) -> Iterator[PieceFile]:
    """Every file of every planned partition's piece, in partition then file order (the order
    ``cap_pieces`` wrote them). Raises ``StalePieceError`` naming every partition whose
    ``piece.json`` is missing or has other inputs than ``plan``, before it yields any."""
    documents, bad = {}, []
    for shard_id in plan["partitions"]:
        path = piece_dir(paths, shard_id) / "piece.json"
        try:
            document = read_json(path) if path.exists() else None
        except CorruptFileError:
            document = None
        if not _whole(paths, shard_id, document, plan):
            bad.append(shard_id)
        documents[shard_id] = document
    if bad:
        raise StalePieceError(
            f"graph pieces of partitions {bad} of run {paths.run_id} are missing or were capped "
            "from another snapshot or other settings: run cap_graph for them"
        )
    for shard_id, document in documents.items():
        folder = piece_dir(paths, shard_id)
        for number, entry in enumerate(document["files"]):
            yield PieceFile(
                shard_id=shard_id,
                **{name: piece_array(folder, number, name) for name in ARRAYS},
                counts=EdgeCounts(**entry["counts"]),
            )
