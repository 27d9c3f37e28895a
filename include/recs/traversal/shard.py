"""One shard task end to end: load the graph, read the inputs, run the flow, write the output.

``traverse_shard`` is what the mapped Airflow task ``traverse_shard`` and ``recs run`` call
(through ``recs.nightly.pipeline``): graph (``graph.load_graph``, checked against the run's
settings) → inputs (``inputs.shard_inputs``) → the compiled flow (``kernel.recommend_users``)
→ output (``output``). A rerun of a shard writes the same bytes.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from recs.files import read_parquet, write_json
from recs.traversal.graph import check_built_for, load_graph
from recs.traversal.inputs import shard_inputs
from recs.traversal.jit import compile_timer
from recs.traversal.kernel import recommend_users
from recs.traversal.output import recommendation_frame, shard_manifest, write_recommendations

log = logging.getLogger("recs.traversal")


def hub_traversals(paths, graph, inputs) -> int:
    """Second-hop entries read through a hub (a first-hop account in ``exports/hub_accounts``):
    the sum of the hubs' capped row lengths over every first-hop list of the shard. Against the
    shard's ``traversals``, the share of the work hub accounts carry (the design's hub
    monitoring). 0 without the export."""

    path = Path(paths.exports_dir) / "hub_accounts.parquet"
    if not path.exists() or not len(inputs.hop1_nodes):
        return 0
    hubs = graph.dense_ids(read_parquet(path, ["user_id"])["user_id"].to_numpy())
    through_hub = np.isin(inputs.hop1_nodes, hubs[hubs >= 0])
    nodes = inputs.hop1_nodes[through_hub].astype(np.int64)
    return int((graph.indptr[nodes + 1] - graph.indptr[nodes]).sum())


def traverse_shard(paths, settings, shard_id: int, graph_dir: Path | None = None) -> dict[str, Any]:
    """Compute and write one shard's recommendations and manifest.

    Reads ``graph_dir`` (default ``paths.graph_dir``; the machine's cached copy with a run
    store: ``recs.nightly.graph_cache``: CSR, per-node activity, id map, all memory-mapped),
    ``snapshot/follow_edges/shard_id=NNN``, ``exports/eligible_users/shard_id=N`` and
    ``exports/follow_exclusions/shard_id=N``. Writes ``paths.shard_output(shard_id)`` (exactly
    ``RECOMMENDATION_SCHEMA``, sorted by user_id, rank; identical bytes on rerun; an empty,
    typed file when the shard has no eligible users) and ``paths.shard_manifest(shard_id)``.

    Returns the manifest (``output.shard_manifest``). Raises ``RunNotFoundError`` (missing
    graph or export), ``StaleGraphError`` and ``ShardMismatchError``.
    """
    started = time.perf_counter()
    cpu_started = time.process_time()
    graph_dir = Path(graph_dir or paths.graph_dir)
    # each phase's compiling (or loading from Numba's cache) is counted apart: a newcomer's
    # first shard booked 2.3 s of compiling the input gathers as reading
    with compile_timer() as read_compile:
        graph = load_graph(graph_dir)
        as_of = paths.as_of.astimezone(dt.UTC).replace(tzinfo=None)
        check_built_for(graph, settings, as_of, graph_dir)
        inputs = shard_inputs(paths, settings, shard_id, graph)
    read_seconds = time.perf_counter() - started - read_compile[0]
    log.info(
        "shard %03d: %d eligible users, %d first-hop edges, %d exclusions (read in %.2fs)",
        shard_id,
        len(inputs.user_ids),
        len(inputs.hop1_nodes),
        len(inputs.excl_nodes),
        read_seconds,
    )
    kernel_started = time.perf_counter()
    with compile_timer() as compile_seconds:  # a fresh machine's first shard compiles it
        result = recommend_users(inputs, graph, settings)
    kernel_seconds = time.perf_counter() - kernel_started - compile_seconds[0]
    write_started = time.perf_counter()
    with compile_timer() as write_compile:
        frame = recommendation_frame(result.rows, inputs, graph, paths)
        output = write_recommendations(frame, paths.shard_output(shard_id))
    write_seconds = time.perf_counter() - write_started - write_compile[0]
    seconds = {
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        "read_seconds": read_seconds,
        "kernel_seconds": kernel_seconds,
        "compile_seconds": read_compile[0] + compile_seconds[0] + write_compile[0],
        "write_seconds": write_seconds,
    }
    manifest = shard_manifest(shard_id, paths.run_id, inputs, result, frame.height, output, seconds)
    manifest["hub_traversals"] = hub_traversals(paths, graph, inputs)
    write_json(paths.shard_manifest(shard_id), manifest)
    log.info(
        "shard %03d: %d rows for %d of %d users, %d traversals in %.2fs (kernel %.2fs); "
        "stage counts %s",
        shard_id,
        manifest["rows"],
        manifest["users_with_recommendations"],
        manifest["users_in"],
        manifest["traversals"],
        seconds["seconds"],
        kernel_seconds,
        manifest["stage_counts"],
    )
    return manifest
