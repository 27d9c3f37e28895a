"""``make bench-import``: the bulk rate of ``recs import edges`` into SQLite and PostgreSQL.

Method:

1. **Input.** A synthetic follow graph (``recs.demo.synthetic``, ``--users`` x ``--degree``:
   power-law in- and out-degrees) written once, as a follow service's export would be: CSV with
   a header ``follower_id,followee_id,created_at`` (ISO-8601 UTC times), rows in random order
   (not the store's key order), plus ``--dirty`` share of bad rows (duplicates, self-loops,
   unparsable ids) so the reject path runs too. Cached in ``--home``/input.
2. **Imports.** For each store, ``recs import edges <file> --json`` runs as a process of its own
   into an **empty** store: SQLite, a new ``live.db``; PostgreSQL, a new database on a throwaway
   durable server (``recs.testing.pgserver``, fsync on). Each is run ``--repeat`` times; the
   best is reported (the machine is shared: the best run is the one least disturbed).
3. **Figures**, per store: edges/s = input rows / wall seconds of the whole command (start-up,
   reading, checking, staging, writing, index builds, commit); CPU seconds of the import process
   (and of the PostgreSQL server); its peak RSS; the phases the command reports (read, write,
   commit). Then, for reference, the same store's **floor**: the engine's own cost for the
   same number of edges, with no parsing, no checks and no client. SQLite: the rows already
   sorted in a table of the same database, copied into ``follow_edges`` by one ``INSERT ...
   SELECT``, the reverse index rebuilt, committed. PostgreSQL: the server ``COPY``ing both
   directions from files on its own disk into the empty tables (keys and the reverse trigger
   off, as the import has them), keys rebuilt, committed.

Results print as a table and go to ``--home``/results.json; the last line is a one-line
summary. The figures of the last run and what bounds them are in ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from recs.demo.synthetic import synthetic_follow_graph

RECS = [sys.executable, "-c", "import sys; from recs.cli import main; sys.exit(main())"]
TIME0 = 1_262_304_000  # 2010-01-01


def write_input(path: Path, users: int, degree: int, dirty: float, seed: int) -> int:
    """The export (module docstring, 1); returns its data rows."""
    graph = synthetic_follow_graph(users, seed, avg_out_degree=degree)
    follower = np.repeat(np.arange(graph.n_users, dtype=np.int64), graph.out_degree())
    followee = graph.indices.astype(np.int64)
    rng = np.random.default_rng(seed)
    created = TIME0 + rng.integers(0, 16 * 365 * 86_400, len(follower))
    frame = pl.DataFrame(
        {
            "follower_id": follower.astype(str),
            "followee_id": followee.astype(str),
            "created_at": pl.from_epoch(pl.Series(created), "s").dt.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )
    bad = int(len(frame) * dirty)
    if bad:
        picks = frame.sample(bad, seed=seed)
        third = bad // 3
        bad_rows = pl.concat(
            [
                picks.slice(0, third),  # duplicates of real rows
                picks.slice(third, third).with_columns(followee_id=pl.col("follower_id")),
                picks.slice(2 * third).with_columns(follower_id=pl.lit("n/a")),
            ]
        )
        frame = pl.concat([frame, bad_rows])
    frame = frame.sample(fraction=1.0, shuffle=True, seed=seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.write_csv(path)
    return frame.height


def server_cpu_seconds(server) -> float:
    """CPU seconds (user + system) the PostgreSQL server has used so far: its postmaster, the
    backends that have exited (the postmaster's waited-for children) and those still running."""
    if server is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])

    def fields(pid: int) -> list[str]:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

    own = fields(postmaster)
    total = sum(int(own[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = fields(int(entry.name))
            except OSError:
                continue
            if int(stat[1]) == postmaster:  # a running backend or worker
                total += int(stat[11]) + int(stat[12])
    return total / tick


class PeakRss:
    """The peak resident set of a running process (``VmHWM``, polled until it exits).

    Not ``ru_maxrss`` from ``wait4``: Linux carries the parent's resident set at ``fork`` into
    the child's high-water mark across ``exec``, and this process holds the generated graph."""

    def __init__(self, pid: int) -> None:
        import threading

        self.kib = 0
        self._done = threading.Event()
        self._status = Path(f"/proc/{pid}/status")
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.is_set():
            try:
                for line in self._status.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.kib = max(self.kib, int(line.split()[1]))
            except (OSError, ValueError):
                pass
            self._done.wait(0.1)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def run_import(path: Path, home: Path, store_url: str | None, server) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECS_")}
    env["RECS_HOME"] = str(home)
    if store_url:
        env["RECS_STORE_URL"] = store_url
    server_before = server_cpu_seconds(server)
    started = time.perf_counter()
    process = subprocess.Popen(
        [*RECS, "import", "edges", str(path), "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    peak = PeakRss(process.pid)
    out = process.stdout.read()
    _pid, status, usage = os.wait4(process.pid, 0)
    peak.stop()
    wall = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"recs import failed ({status}); rerun by hand: RECS_HOME={home}")
    summary = json.loads(out)
    return {
        "rows": summary["rows_read"],
        "loaded": summary["loaded"],
        "rejected": summary["rejected"],
        "wall_seconds": round(wall, 2),
        "edges_per_second": round(summary["rows_read"] / wall),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "server_cpu_seconds": round(server_cpu_seconds(server) - server_before, 1),
        "peak_rss_mb": round(peak.kib / 1024),
        "phases": summary["timings"],
    }


def floor_edges(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """About ``rows`` distinct follows in key order, 50 per follower, each follower's followees
    spread over the whole id range (a random permutation of the ids), as in a real graph: the
    reverse key must really be sorted. (Until 2026-12-02 the followees were ``follower + 1 + 7k``,
    nearly in order already, which made both floors' reverse keys almost free to build.)"""
    index = np.arange(rows, dtype=np.int64)
    follower = index // 50
    users = int(follower[-1]) + 1 if rows else 0
    permutation = np.random.default_rng(7).permutation(users)
    followee = permutation[(follower + 1 + index % 50 * 7) % users]
    keep = followee != follower
    follower, followee = follower[keep], followee[keep]
    order = np.lexsort((followee, follower))
    return follower[order], followee[order]


def sqlite_floor(rows: int, folder: Path) -> dict:
    """SQLite's floor (module docstring, 3): the rows already sorted in a table of the same
    database, copied into ``follow_edges`` by one ``INSERT ... SELECT``, the reverse index
    rebuilt, committed, with the import's own settings (``bulk_load``)."""
    import adbc_driver_sqlite.dbapi as adbc
    import pyarrow as pa

    from recs.store import schema
    from recs.store.connections import apply_sqlite_pragmas, engine_for

    path = folder / "floor.db"
    engine = engine_for(f"sqlite:///{path}")
    schema.create_schema(engine)
    engine.dispose()
    connection = adbc.connect(str(path), autocommit=True)
    cursor = connection.cursor()
    apply_sqlite_pragmas(cursor, "bulk_load")
    follower, followee = floor_edges(rows)
    rows = len(follower)
    cursor.adbc_ingest("src", pa.table({"a": follower, "b": followee}), mode="create")
    started, cpu = time.perf_counter(), time.process_time()
    cursor.execute("BEGIN IMMEDIATE")
    cursor.execute("DROP INDEX ix_follow_edges_reverse")
    cursor.execute(
        "INSERT INTO follow_edges (follower_id, followee_id, created_at, status) "
        "SELECT a, b, '2000-01-01 00:00:00.000000', 'active' FROM src"
    )
    cursor.execute(
        "CREATE INDEX ix_follow_edges_reverse ON follow_edges (followee_id, follower_id)"
    )
    cursor.execute("COMMIT")
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    cursor.close()
    connection.close()
    return {
        "rows": rows,
        "wall_seconds": round(wall, 2),
        "edges_per_second": round(rows / wall),
        "cpu_seconds": round(cpu, 1),
    }


def postgres_floor(rows: int, url: str, folder: Path, server) -> dict:
    """PostgreSQL's floor (module docstring, 3): the server ``COPY``s both directions from
    files on its own disk (no client) into the empty tables, keys and the reverse trigger off
    as the import has them, keys rebuilt, committed."""
    import psycopg

    from recs.store import schema
    from recs.store.connections import engine_for, libpq_url

    engine = engine_for(url)
    schema.create_schema(engine)
    engine.dispose()
    follower, followee = floor_edges(rows)
    rows = len(follower)
    files = {}
    for name, (left, right) in {
        "forward": (follower, followee),
        "reverse": (followee, follower),
    }.items():
        frame = pl.DataFrame({"left": left, "right": right}).sort("left", "right")
        files[name] = folder / f"{name}.csv"
        frame.with_columns(at=pl.lit("2000-01-01 00:00:00"), status=pl.lit("active")).write_csv(
            files[name], include_header=False
        )
    folder.chmod(0o755)
    server_before = server_cpu_seconds(server)
    started = time.perf_counter()
    with psycopg.connect(libpq_url(url)) as connection:
        connection.execute("SET LOCAL maintenance_work_mem = '512MB'")
        for statement in (
            "ALTER TABLE follow_edges DISABLE TRIGGER recs_follow_edges_reverse_insert",
            "ALTER TABLE follow_edges DROP CONSTRAINT pk_follow_edges",
            "ALTER TABLE follow_edges_reverse DROP CONSTRAINT pk_follow_edges_reverse",
            "COPY follow_edges (follower_id, followee_id, created_at, status) "
            f"FROM '{files['forward']}' (FORMAT csv)",
            "COPY follow_edges_reverse (followee_id, follower_id, created_at, status) "
            f"FROM '{files['reverse']}' (FORMAT csv)",
            "ALTER TABLE follow_edges ADD CONSTRAINT pk_follow_edges "
            "PRIMARY KEY (follower_id, followee_id)",
            "ALTER TABLE follow_edges_reverse ADD CONSTRAINT pk_follow_edges_reverse "
            "PRIMARY KEY (followee_id, follower_id)",
            "ALTER TABLE follow_edges ENABLE TRIGGER recs_follow_edges_reverse_insert",
        ):
            connection.execute(statement)
        connection.commit()
    wall = time.perf_counter() - started
    return {
        "rows": rows,
        "wall_seconds": round(wall, 2),
        "edges_per_second": round(rows / wall),
        "server_cpu_seconds": round(server_cpu_seconds(server) - server_before, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--degree", type=int, default=50)
    parser.add_argument("--dirty", type=float, default=0.001, help="share of bad rows")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor measurements")
    parser.add_argument(
        "--home", type=Path, default=Path(tempfile.gettempdir()) / "recs-bench-import"
    )
    args = parser.parse_args(argv)
    stores = [s for s in args.stores.split(",") if s]

    source = args.home / "input" / f"edges-{args.users}x{args.degree}-{args.dirty}-{args.seed}.csv"
    if not source.exists():
        print(f"writing {source} ...", flush=True)
        rows = write_input(source, args.users, args.degree, args.dirty, args.seed)
    else:
        rows = pl.scan_csv(source).select(pl.len()).collect().item()
    print(f"input: {rows:,} rows, {source.stat().st_size / 1e6:,.0f} MB, {source}", flush=True)

    server = None
    results: dict = {"input": str(source), "rows": rows, "load_average": os.getloadavg()}
    try:
        if "postgresql" in stores:
            from recs.testing import pgserver

            server = pgserver.start(durable=True)
        for store in stores:
            runs = []
            for attempt in range(args.repeat):
                home = args.home / f"{store}-{attempt}"
                shutil.rmtree(home, ignore_errors=True)
                url = None
                if store == "postgresql":
                    url = server.create_database(f"bench_{attempt}_{int(time.time())}")
                runs.append(run_import(source, home, url, server))
                print(f"  {store} run {attempt + 1}: {runs[-1]}", flush=True)
                shutil.rmtree(home, ignore_errors=True)
            best = max(runs, key=lambda run: run["edges_per_second"])
            results[store] = {"best": best, "runs": runs}
            if not args.no_floor:
                folder = args.home / f"{store}-floor"
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True)
                floor = (
                    sqlite_floor(best["loaded"], folder)
                    if store == "sqlite"
                    else postgres_floor(
                        best["loaded"], server.create_database("floor"), folder, server
                    )
                )
                results[store]["floor"] = floor
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        if server is not None:
            server.stop()
    results["load_average_end"] = os.getloadavg()
    (args.home / "results.json").write_text(json.dumps(results, indent=2))

    print(f"\nrecs import edges, {rows:,} rows (load average {results['load_average'][0]:.1f})")
    print(
        f"{'store':<12}{'edges/s':>12}{'wall s':>9}{'CPU s':>8}{'server CPU s':>14}"
        f"{'peak RSS MB':>13}{'floor edges/s':>15}"
    )
    for store in stores:
        best = results[store]["best"]
        floor = results[store].get("floor", {}).get("edges_per_second")
        print(
            f"{store:<12}{best['edges_per_second']:>12,}{best['wall_seconds']:>9}"
            f"{best['cpu_seconds']:>8}{best['server_cpu_seconds']:>14}{best['peak_rss_mb']:>13,}"
            f"{'-' if floor is None else f'{floor:,}':>15}"
        )
    print(
        "summary: "
        + ", ".join(
            f"{store} {results[store]['best']['edges_per_second']:,} edges/s "
            f"(peak RSS {results[store]['best']['peak_rss_mb']:,} MB)"
            for store in stores
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
