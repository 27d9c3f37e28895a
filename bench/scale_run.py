"""``make bench-scale``: the whole nightly pipeline on a 1 M-user graph (and 5 M), stage by stage.

Generates a synthetic power-law graph into its own ``RECS_HOME`` (default ``/tmp/recs-scale``;
never ``./data``; the caller's live, snapshot and run store settings are not passed on:
``NOT_INHERITED``) with ``recs generate-graph`` (1 M users x 50 follows = 50 M edges; the
popularity tail gives hubs with in-degree over 200 k), then runs the nightly stages in order,
**each in its own process** so each stage's peak memory is its own: ``freeze_snapshot``,
``build_models`` (dbt), the graph as the DAG builds it (``plan_graph``, ``cap_graph`` x groups
of partitions, ``build_graph``: the assembly), ``traverse_shard`` x ``shard_count`` (16; one process
per shard, as Airflow's mapped tasks run), ``validate_shards`` x groups (the gate's GX
checks of each shard), ``validate_run`` (the run-wide checks and the verdict) and
``publish_run``. The same functions the DAG's tasks call (``recs.nightly.pipeline``), with the
same run-scoped paths. Every run freezes from the live store (a retained snapshot, the run
folder and ``published/`` are removed first).

Prints a per-stage table (wall seconds, CPU seconds of the stage's process, peak RSS) and a
per-shard summary (traversals, traversals per CPU-second of the task and of the whole process,
peak RSS split into the private part and the shared, file-backed graph mapping), then checks:
at least 50 M edges and a hub with in-degree >= 100 k, shard peak RSS under 2 GB each, >= 30 M
traversals per second per core for the shard task, a passed gate, the stages around the
traversal taking together no longer than it (wall seconds, tasks one after another), and every
task's peak RSS under 2 GB. Then the night model (``night_model.py``). Results go to
``<home>/scale-run.json``. Thread pools are pinned to one thread in the shard processes (as in
``make bench``), so their CPU seconds are one core's.

Usage: ``python bench/scale_run.py [--users 1000000] [--shards 16] [--home /tmp/recs-scale]
[--reuse-store]``. At 1 M users it needs ~4 GB of disk for the live store and ~2 GB for the run,
and about 15 minutes on 2 cores with the store generated; 5 M users (``--shards 80``) about five
times that, and ~25 minutes to generate the store. Measured figures: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from night_model import night_model, render  # noqa: E402 - a module beside this script

SNAPSHOT_DATE = "2026-11-01"  # the reference date of generated fields (recs.demo.generated)
RUN_ID = "scale"
RSS_LIMIT_MB = 2048
RATE_TARGET = 30e6
#: Settings that would point the benchmark's stages at data other than its own ``--home``:
#: the live store (which ``generate-graph --replace`` drops and reloads), the snapshot store,
#: the run store and its cache. Left out of the stages' environment (``own_environment``).
NOT_INHERITED = (
    "RECS_STORE_URL", "RECS_SNAPSHOT_STORE_URL", "RECS_RUN_STORE_URL", "RECS_RUN_STORE_OPTIONS",
    "RECS_RUN_CACHE_DIR",
)
PINNED = (
    "POLARS_MAX_THREADS", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS", "RAYON_NUM_THREADS",
)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``: ``ru_maxrss`` would include the parent's, as it
    survives exec), or the largest of its waited-for children if that is larger."""
    peak = 0.0
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024.0
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    return max(peak, children)


def own_environment(
    environ: dict[str, str], home: Path, shards: int
) -> tuple[dict[str, str], list[str]]:
    """The stages' environment: ``environ`` without ``NOT_INHERITED`` (any case, as the
    settings read them), with ``RECS_HOME`` = ``home`` and ``RECS_SHARD_COUNT`` = ``shards``,
    so every stage reads and writes under ``home`` only; and the names left out."""
    dropped = sorted(name for name in environ if name.upper() in NOT_INHERITED)
    env = {name: value for name, value in environ.items() if name not in dropped}
    return {**env, "RECS_HOME": str(home), "RECS_SHARD_COUNT": str(shards)}, dropped


def stage_child(name: str, home: str, run_id: str, shard: str | None) -> None:
    """Child mode: run one stage in this process and print one JSON line."""
    from recs.config import get_settings
    from recs.nightly import pipeline
    from recs.nightly.runs import RunPaths

    paths = RunPaths.create(home, SNAPSHOT_DATE, run_id)
    started = time.perf_counter()
    if name == "freeze_snapshot":
        result = pipeline.freeze_snapshot(paths, get_settings())
    elif name == "traverse_shard":
        result = pipeline.traverse_shard(paths, int(shard))
    elif name == "cap_graph":
        pieces = pipeline.cap_graph(paths, [int(i) for i in shard.split(",")])
        result = {"partitions": len(pieces), "capped_edges": sum(p["capped_edges"] for p in pieces),
                  "edges_read": sum(p["edges_read"] for p in pieces)}
    elif name == "plan_graph":
        result = {"groups": pipeline.plan_graph(paths)}
    elif name == "validate_shards":
        results = pipeline.validate_shards(paths, [int(i) for i in shard.split(",")])
        result = {"rows": sum(r.get("rows", 0) for r in results), "shards": len(results),
                  "success": all(r.get("success") is not False for r in results)}
    else:
        result = getattr(pipeline, name)(paths)
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "stage_seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": peak_rss_mb(),
        "result": result,
    }, default=str))


def run_child(arguments: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run ``arguments`` as a child process; return its last JSON line plus wall time and the
    child's own rusage (CPU seconds of it and its waited-for children)."""
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("a") as stderr:
        completed = subprocess.run(
            arguments, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, check=False
        )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f"{' '.join(arguments)} failed ({completed.returncode}); see {log}")
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = wall
    result["process_cpu_seconds"] = (after.ru_utime - before.ru_utime) + (
        after.ru_stime - before.ru_stime
    )
    return result


def fmt_mb(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--avg-out-degree", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--home", default="/tmp/recs-scale")
    parser.add_argument("--run-id", default=RUN_ID)
    parser.add_argument("--reuse-store", action="store_true",
                        help="skip generate-graph if this home's live store exists")
    parser.add_argument("--night-cores", type=int, default=1024,
                        help="cores the night model spreads the shard stage over (default "
                             "1024: Airflow's max_map_length of mapped shard tasks)")
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # id(s), a,b,...
    args = parser.parse_args(argv)
    if args.stage:
        stage_child(args.stage, args.home, args.run_id, args.shard)
        return 0

    home = Path(args.home).resolve()
    if home == (Path.cwd() / "data").resolve():
        raise SystemExit("refusing to use ./data: pass a --home of its own")
    home.mkdir(parents=True, exist_ok=True)
    log = home / "scale-run.log"
    log.write_text("")
    env, dropped = own_environment(dict(os.environ), home, args.shards)
    if dropped:
        say(f"ignoring {', '.join(dropped)}: the benchmark uses only its own store under {home}")
    pinned = {**env, **{variable: "1" for variable in PINNED}}
    me = [sys.executable, str(Path(__file__).resolve())]
    recs_cli = [sys.executable, "-m", "recs.cli"]
    stages: list[dict[str, Any]] = []
    load_before = os.getloadavg()

    def stage(name: str, arguments: list[str], environment: dict[str, str], note=None):
        say(f"{name} ...")
        result = run_child(arguments, environment, log)
        row = {
            "stage": name,
            "wall_seconds": result["wall_seconds"],
            "cpu_seconds": result.get("cpu_seconds", result["process_cpu_seconds"]),
            "peak_rss_mb": result.get("peak_rss_mb"),
            "result": result.get("result", result),
        }
        row["note"] = note(row["result"]) if note else ""
        stages.append(row)
        say(f"  {row['wall_seconds']:.1f} s wall, {row['cpu_seconds']:.1f} s CPU, "
            f"peak RSS {fmt_mb(row['peak_rss_mb'])} MB {row['note']}")
        return row

    store = home / "live.db"
    generated: dict[str, Any] = {}
    store_reused = args.reuse_store and store.exists() and (home / "generate-graph.json").exists()
    if store_reused:
        generated = json.loads((home / "generate-graph.json").read_text())
        say(f"reusing the live store {store}")
    else:
        started = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        say(f"generate-graph: {args.users:,} users x {args.avg_out_degree} ...")
        with log.open("a") as stderr:
            completed = subprocess.run(
                [*recs_cli, "generate-graph", "--users", str(args.users), "--seed", str(args.seed),
                 "--avg-out-degree", str(args.avg_out_degree), "--replace", "--json"],
                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, check=False,
            )
        if completed.returncode != 0:
            raise SystemExit(f"recs generate-graph failed; see {log}")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        generated = json.loads(completed.stdout)
        generated["bench"] = {
            "wall_seconds": time.perf_counter() - started,
            "cpu_seconds": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
            "peak_rss_mb": after.ru_maxrss / 1024.0,
        }
        (home / "generate-graph.json").write_text(json.dumps(generated, indent=2))
    reused = " (reused: timings of the run that made it)" if store_reused else ""
    stages.append({
        "stage": "generate_graph", **generated.get("bench", {}), "result": {},
        "note": f"{generated['users']:,} users, {generated['follow_edges']:,} edges, "
                f"max in-degree {generated['max_in_degree']:,}{reused}",
    })

    run_dir = home / "runs" / SNAPSHOT_DATE / args.run_id
    # every run freezes from the live store: a retained snapshot (an earlier run's) would make
    # freeze_snapshot a hard link, and an old run folder would be rewritten, not measured
    for old in (home / "snapshots", run_dir, home / "published"):
        shutil.rmtree(old, ignore_errors=True)
    run = ["--home", str(home), "--run-id", args.run_id]
    stage("freeze_snapshot", [*me, "--stage", "freeze_snapshot", *run], env,
          lambda r: f"{r['row_counts']['follow_edges']:,} follow edges")
    stage("build_models", [*me, "--stage", "build_models", *run], env,
          lambda r: f"{r['rows']['follow_exclusions']:,} exclusions besides the follows, "
                    f"{r['rows']['eligible_users']:,} eligible users")
    # Numba caches compiled code on disk per code version (cache=True); the first process after
    # a change compiles. Load those caches once, untimed, so the timed tasks measure what a
    # deployed worker does: the graph build's row sort here, the traversal's kernel below.
    say("JIT cache warm-up (the graph build's row sort, untimed) ...")
    subprocess.run([sys.executable, "-c", "import numpy as np; from recs.traversal.hop_order "
                    "import grouped_order as g; g(np.zeros(2, int), np.zeros(2, np.uint64), "
                    "np.arange(2))"], env=env, check=True)
    # the graph as the DAG builds it: the plan, a mapped cap_graph task per group of
    # partitions (one after another here), the assembly (the DAG's build_graph task)
    graph_groups = stage("plan_graph", [*me, "--stage", "plan_graph", *run], env,
                         lambda r: f"{len(r['groups'])} group(s) of partitions")["result"]["groups"]
    caps = [
        stage(f"cap_graph {group[0]:03d}-{group[-1]:03d}",
              [*me, "--stage", "cap_graph", "--shard", ",".join(map(str, group)), *run], env,
              lambda r: f"{r['capped_edges']:,} capped of {r['edges_read']:,}")
        for group in graph_groups
    ]
    stages[-len(caps):] = []
    stages.append({
        "stage": f"cap_graph x {len(caps)}",
        "wall_seconds": sum(s["wall_seconds"] for s in caps),
        "cpu_seconds": sum(s["cpu_seconds"] for s in caps),
        "peak_rss_mb": max(s["peak_rss_mb"] for s in caps),
        "note": f"one process per group of {len(graph_groups[0])} partitions, run one after "
                "another",
    })
    stage("build_graph", [*me, "--stage", "assemble_graph", *run], env,
          lambda r: f"{r['n_edges']:,} capped entries of {r['edges_read']:,} (assembly)")
    say("JIT cache warm-up (shard 0, untimed) ...")
    warm_up = run_child(
        [*me, "--stage", "traverse_shard", "--shard", "0", *run], pinned, log
    )["wall_seconds"]
    shards = []
    for shard_id in range(args.shards):
        shards.append(stage(
            f"traverse_shard {shard_id:03d}",
            [*me, "--stage", "traverse_shard", "--shard", str(shard_id), *run], pinned,
            lambda r: f"{r['traversals']:,} traversals, "
                      f"{r['traversals_per_cpu_second'] / 1e6:.1f} M/s task",
        ))
    stages[-len(shards):] = []
    from recs.nightly import pipeline
    from recs.nightly.runs import RunPaths

    # the DAG's plan_gate: the groups of the run's own frozen settings
    groups = pipeline.gate_groups(
        RunPaths.create(home, SNAPSHOT_DATE, args.run_id), list(range(args.shards))
    )
    gates = [
        stage(f"validate_shards {group[0]:03d}-{group[-1]:03d}",
              [*me, "--stage", "validate_shards", "--shard", ",".join(map(str, group)), *run],
              env, lambda r: f"{r.get('rows', 0):,} rows, success={r.get('success')}")
        for group in groups
    ]
    stages[-len(gates):] = []
    validated = stage("validate_run", [*me, "--stage", "validate_run", *run], env,
          lambda r: f"{r.get('rows', 0):,} rows, {r.get('evaluated', '?')} checks, "
                    f"success={r.get('success')}")["result"]
    stage("publish_run", [*me, "--stage", "publish_run", *run], env,
          lambda r: f"{r.get('rows', 0):,} rows for {r.get('users', 0):,} users")

    # the shard stage as one row (sequential: one core), placed after build_graph
    tasks = [s["result"] for s in shards]
    traversals = sum(t["traversals"] for t in tasks)
    task_cpu = sum(t["cpu_seconds"] for t in tasks)
    process_cpu = sum(s["cpu_seconds"] for s in shards)
    shard_row = {
        "stage": f"traverse_shard x {len(shards)}",
        "wall_seconds": sum(s["wall_seconds"] for s in shards),
        "cpu_seconds": process_cpu,
        "peak_rss_mb": max(s["peak_rss_mb"] for s in shards),
        "note": f"{traversals:,} traversals; one process per shard, run one after another",
    }
    gate_row = {
        "stage": f"validate_shards x {len(gates)}",
        "wall_seconds": sum(s["wall_seconds"] for s in gates),
        "cpu_seconds": sum(s["cpu_seconds"] for s in gates),
        "peak_rss_mb": max(s["peak_rss_mb"] for s in gates),
        "note": f"{sum(g['result'].get('rows', 0) for g in gates):,} rows; one process per "
                f"group of {len(groups[0]) if groups else 0} shards, run one after another",
    }
    at = next(i for i, s in enumerate(stages) if s["stage"] == "validate_run")
    stages[at:at] = [shard_row, gate_row]
    load_after = os.getloadavg()

    total_wall = sum(s.get("wall_seconds", 0.0) for s in stages)
    print(f"scale run under {home} ({args.users:,} users, {args.shards} shards); "
          f"load average {load_before[0]:.1f} before / {load_after[0]:.1f} after "
          "(2 cores shared with other work)")
    print()
    print(f"{'stage':<22} {'wall s':>8} {'share':>6} {'CPU s':>8} {'peak RSS MB':>12}  notes")
    for s in stages:
        share = s.get("wall_seconds", 0.0) / total_wall if total_wall else 0.0
        print(f"{s['stage']:<22} {s.get('wall_seconds', 0.0):>8.1f} {share:>6.0%} "
              f"{s.get('cpu_seconds', 0.0):>8.1f} {fmt_mb(s.get('peak_rss_mb')):>12}  "
              f"{s.get('note', '')}")
    print(f"{'total':<22} {total_wall:>8.1f}")
    print(f"(before the shard tasks, untimed: one warm-up task loading the JIT cache, "
          f"{warm_up:.1f} s)")
    print()
    results_file = run_dir / "dbt" / "target" / "run_results.json"
    if results_file.exists():
        nodes = json.loads(results_file.read_text())["results"]
        slowest = sorted(nodes, key=lambda n: -n["execution_time"])[:6]
        print(f"build_models: {len(nodes)} dbt nodes; slowest (seconds, as run with dbt's "
              "threads):")
        for node in slowest:
            print(f"  {node['execution_time']:>7.1f}  {node['unique_id']}")
        print()

    def spread(values) -> str:
        return (f"min {min(values):,.0f} / median {statistics.median(values):,.0f} / "
                f"max {max(values):,.0f}")

    print(f"shard tasks ({len(tasks)}; threads pinned to 1; rates per CPU-second):")
    print(f"  eligible users per shard  {spread([t['users_in'] for t in tasks])}")
    print(f"  traversals per shard      {spread([t['traversals'] for t in tasks])}")
    print(f"  task (traverse_shard, fresh process): {traversals / task_cpu / 1e6:.1f} M/s "
          f"({task_cpu:.1f} CPU s; read {sum(t['read_seconds'] for t in tasks):.1f} s, kernel "
          f"{sum(t['kernel_seconds'] for t in tasks):.1f} s, write "
          f"{sum(t['write_seconds'] for t in tasks):.1f} s wall)")
    print(f"  whole process (+ interpreter, imports): {traversals / process_cpu / 1e6:.1f} M/s "
          f"({process_cpu:.1f} CPU s)")
    print(f"  peak RSS MB               {spread([s['peak_rss_mb'] for s in shards])}")
    print(f"    private (RssAnon, end)  {spread([t.get('rss_anon_mb', 0) for t in tasks])}")
    print(f"    shared graph mapping and libraries (RssFile, end) "
          f"{spread([t.get('rss_file_mb', 0) for t in tasks])}")
    graph_mb = sum(p.stat().st_size for p in (run_dir / "graph").iterdir()) / 2**20
    print(f"  the run's graph/ (memory-mapped by every shard): {graph_mb:,.0f} MB")
    print()

    night = [s for s in stages if s["stage"] != "generate_graph"]
    shard_wall = shard_row["wall_seconds"]
    others = sum(s["wall_seconds"] for s in night if s is not shard_row)
    heaviest = max(night, key=lambda s: s.get("peak_rss_mb") or 0.0)
    checks = [
        ("follow edges >= 50 M", generated["follow_edges"] >= 50_000_000,
         f"{generated['follow_edges']:,}"),
        ("a hub with in-degree >= 100 k", generated["max_in_degree"] >= 100_000,
         f"{generated['max_in_degree']:,}"),
        (f"every shard's peak RSS < {RSS_LIMIT_MB} MB", shard_row["peak_rss_mb"] < RSS_LIMIT_MB,
         f"max {shard_row['peak_rss_mb']:,.0f} MB"),
        ("shard task >= 30 M traversals/s/core", traversals / task_cpu >= RATE_TARGET,
         f"{traversals / task_cpu / 1e6:.1f} M/s"),
        ("validated (GX gate) and published", validated.get("success") is True,
         f"{validated.get('evaluated', '?')} checks on {validated.get('rows', 0):,} rows"),
        ("the stages around the traversal take no longer than it", others <= shard_wall,
         f"{others:,.1f} s against {shard_wall:,.1f} s"),
        (f"every task's peak RSS < {RSS_LIMIT_MB} MB", heaviest["peak_rss_mb"] < RSS_LIMIT_MB,
         f"max {heaviest['peak_rss_mb']:,.0f} MB ({heaviest['stage']})"),
    ]
    for name, passed, value in checks:
        print(f"  {'PASS' if passed else 'FAIL'}  {name}: {value}")
    print()
    built = next(s["result"] for s in stages if s["stage"] == "build_models")
    costs = night_model(
        stages,
        edges=generated["follow_edges"],
        accounts=generated["users"],
        eligible_users=built["rows"]["eligible_users"],
        traversals=traversals,
        rows=validated.get("rows", 0),
        shard_peak_mb=shard_row["peak_rss_mb"],
        cores=args.night_cores,
    )
    machine_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    for line in render(costs, args.night_cores, machine_gb):
        print(line)
    (home / "scale-run.json").write_text(json.dumps({
        "stages": stages, "shards": shards, "generated": generated,
        "load_average": [load_before, load_after],
        "checks": {name: passed for name, passed, _ in checks},
        "night_model": [vars(c) for c in costs],
    }, indent=2, default=str))
    print(f"\nresults: {home / 'scale-run.json'}; log: {log}")
    return 0 if all(passed for _, passed, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
