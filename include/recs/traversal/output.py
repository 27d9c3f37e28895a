"""Output of one shard task: the recommendations frame, its Parquet file and the manifest.

The frame is exactly ``contracts.RECOMMENDATION_SCHEMA`` (one row per user x kept candidate,
sorted by user_id, rank), built in Polars from the kernel's NumPy rows with dense ids mapped
back to original ids; the file is written atomically and reproducibly (the same frame gives the
same bytes with the same library versions). The manifest (``shard_manifest``) carries the
task's counts (including the kernel's per-stage counts), timings and memory.
"""

from __future__ import annotations

import datetime as dt
import resource
from pathlib import Path
from typing import Any

import numpy as np

from recs.arrays import sorted_unique
from recs.contracts import RECOMMENDATION_SCHEMA, check_schema
from recs.files import atomic_path


def recommendation_frame(rows, inputs, graph, paths):
    """The shard's output frame in ``contracts.RECOMMENDATION_SCHEMA``, sorted (user_id, rank).

    ``rows``: the kernel's ``take.OutputRows``; ``inputs``: ``inputs.ShardInputs``; ``graph``: the
    ``CappedGraph`` (its ``user_ids``). Maps dense ids back to original ids; ``followed_by`` is
    ``List(Int64)`` of original ids; ``generated_at`` is ``paths.as_of`` (naive UTC) and
    ``run_id`` is ``paths.run_id``. Built in Polars from NumPy (no ``pyarrow.array``, whose
    first call imports pandas: ``bench/README.md``).
    """
    import polars as pl

    n_rows, fb = rows.followed_by.shape
    set_ = rows.followed_by >= 0
    followed_ids = np.zeros((n_rows, fb), dtype=np.int64)
    followed_ids[set_] = graph.user_ids[rows.followed_by[set_]]
    if fb:
        followed_by = pl.DataFrame({"ids": followed_ids, "n": rows.followed_by_n}).select(
            pl.col("ids").arr.to_list().list.head(pl.col("n"))
        )["ids"]
    else:
        followed_by = pl.Series("followed_by", [[]] * n_rows, dtype=pl.List(pl.Int64))
    generated_at = paths.as_of.astimezone(dt.UTC).replace(tzinfo=None)
    frame = pl.DataFrame(
        {
            "user_id": pl.Series(inputs.user_ids[rows.user], dtype=pl.Int64),
            "candidate_id": pl.Series(np.asarray(graph.user_ids[rows.candidate]), dtype=pl.Int64),
            "mutual_count": pl.Series(rows.mutual_count, dtype=pl.Int32),
            "score": pl.Series(rows.score, dtype=pl.Float64),
            "rank": pl.Series(rows.rank, dtype=pl.Int32),
            "followed_by": followed_by.cast(pl.List(pl.Int64)),
        }
    ).with_columns(
        pl.lit(generated_at, dtype=pl.Datetime("us")).alias("generated_at"),
        pl.lit(paths.run_id, dtype=pl.String).alias("run_id"),
    )
    frame = frame.select(list(RECOMMENDATION_SCHEMA))
    check_schema(frame.schema, RECOMMENDATION_SCHEMA, "shard recommendations")
    return frame


def write_recommendations(frame, path: Path) -> Path:
    """Write ``frame`` as Parquet atomically and durably (``recs.files.atomic_path``: a temporary
    file of this attempt's own, fsynced, then ``os.replace``), reproducibly: a task killed
    mid-write leaves the previous file, never half a file.

    Fixed compression, one writer thread's deterministic layout: the same frame gives the same
    bytes on every run with the same library versions.
    """
    with atomic_path(path) as tmp:
        frame.write_parquet(tmp, compression="zstd", compression_level=3, statistics=True)
    return Path(path)


def memory_mb() -> dict[str, float]:
    """This process's memory in MB: ``peak_rss_mb`` (the peak resident set, which counts the
    pages of the memory-mapped graph it touched) and, now, ``rss_anon_mb`` (private memory) and
    ``rss_file_mb`` (file-backed pages: the shared graph mapping and the libraries).

    On Linux from ``/proc/self/status`` (``VmHWM``, ``RssAnon``, ``RssFile``): ``ru_maxrss``
    is not used there because it survives ``exec``, so a task started by a big parent (a
    forked Airflow worker, a benchmark) would report the parent's peak. Elsewhere
    ``ru_maxrss`` only.
    """
    fields = {"VmHWM": "peak_rss_mb", "RssAnon": "rss_anon_mb", "RssFile": "rss_file_mb"}
    found: dict[str, float] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in fields:
                    found[fields[name]] = round(int(value.split()[0]) / 1024.0, 1)
    except OSError:
        pass
    if "peak_rss_mb" not in found:
        # ru_maxrss is in KiB on Linux, bytes on macOS; this fallback is for other systems
        found["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    return {"peak_rss_mb": found.pop("peak_rss_mb"), **found}


def shard_manifest(
    shard_id: int,
    run_id: str,
    inputs,
    result,
    rows: int,
    output: Path,
    seconds: dict[str, float],
) -> dict[str, Any]:
    """The shard task's manifest (``recs.files`` JSON): ``shard_id, run_id, users_in,
    users_with_recommendations, rows, traversals`` (second-hop entries counted),
    ``first_hop_edges, exclusions``, the ``seconds`` given (``seconds`` wall of the whole task,
    ``cpu_seconds`` of this process, ``read_seconds``, ``kernel_seconds`` (the compiled
    kernel's run) and ``write_seconds``, each without its ``compile_seconds``: compiling or
    loading compiled code from Numba's cache, ``jit.compile_timer``, summed over the three),
    ``traversals_per_cpu_second``, ``memory_mb()``, ``stage_counts`` (``kernel.STAGE_COUNTS``:
    name -> count) and ``output``."""
    cpu_seconds = seconds["cpu_seconds"]
    return {
        "shard_id": int(shard_id),
        "run_id": run_id,
        "users_in": int(len(inputs.user_ids)),
        "users_with_recommendations": int(len(sorted_unique(result.rows.user))),
        "rows": int(rows),
        "traversals": int(result.traversals),
        "first_hop_edges": int(len(inputs.hop1_nodes)),
        "exclusions": int(len(inputs.excl_nodes)),
        **{name: round(value, 3) for name, value in seconds.items()},
        "traversals_per_cpu_second": int(result.traversals / cpu_seconds) if cpu_seconds else 0,
        **memory_mb(),
        "stage_counts": dict(result.stage_counts),
        "output": str(output),
    }
