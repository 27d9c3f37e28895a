"""Load-test the read API on loopback: each scenario's errors and p50/p99/p999 (``make bench-api``).

Method (``--help`` for the knobs; ``bench/README.md`` has the figures):

1. A Slashdot home of its own (``--home``, default ``/tmp/recs-bench-api``): loads
   soc-Slashdot0902 and runs the pipeline for 2026-11-01 once, reused by later runs. Each run
   works on a fresh copy of it (the live store copied with SQLite's backup API, the published
   versions linked), so dismissals never accumulate across runs, and a second version (the same
   lists under another run id, hard links) is there to switch to.
2. Picks ``--users`` users per path by asking the read path itself (``who_to_follow``): *batch*
   users are answered from the batch list, *cold_start* users from the cold-start path.
3. Starts ``recs serve --workers N`` on 127.0.0.1 (its HTTP limits on) and runs the scenarios:

   - ``batch`` / ``cold_start``: wrk at ``--rate`` / ``--cold-rate`` req/s, paced
     (``api_load``), then the server-side histogram as a cross-check;
   - ``dismissals``: POSTs at ``--dismiss-rate``/s (each a new pair: an insert and an fsync)
     while wrk reads at ``--read-rate`` req/s;
   - ``switch``: reads at ``--read-rate`` while ``CURRENT`` alternates between the two versions
     every ``--swap-every`` s (every worker loads each, then all switch: ``serving.coordination``);
   - ``soak_sqlite``: for ``--soak-seconds``, bursts of ``--burst`` concurrent reads and as many
     dismissals, ``--soak-gap`` s apart (longer than anyio's 10 s thread idle timeout);
   - ``soak_postgres``: the same against a PostgreSQL live store (a throwaway cluster of
     Debian's server binaries, the same dataset loaded into it), if they are installed.
   - ``ceiling``: closed-loop batch reads, no think time (the throughput bound, not a target).

4. Prints one table (errors, p50/p99/p999, the target and whether it was met) and writes
   ``<home>/bench/api.json``. Exit status 1 if any scenario had an error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import api_load  # noqa: E402 - the load generators beside this file

BIN = Path(sys.executable).parent
DATE = "2026-11-01"
TARGETS = {
    "batch": ("p99", 5.0, "p99 <= 5 ms at 2,000 req/s, 2 workers"),
    "cold_start": ("p99", 20.0, "p99 <= 20 ms"),
    "dismissals": ("p99", 20.0, "write p99 <= 20 ms at 200/s while reads run"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", default="/tmp/recs-bench-api", help="the bench's own RECS_HOME")
    parser.add_argument("--rate", type=float, default=2000.0, help="batch reads offered, req/s")
    parser.add_argument("--cold-rate", type=float, default=1000.0)
    parser.add_argument("--read-rate", type=float, default=1000.0,
                        help="reads beside the dismissals and the switch")  # fmt: skip
    parser.add_argument("--dismiss-rate", type=float, default=200.0)
    parser.add_argument("--duration", type=int, default=30, help="seconds per paced run")
    parser.add_argument("--warmup", type=int, default=5, help="seconds of warm-up per run")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--port", type=int, default=8799)
    parser.add_argument("--users", type=int, default=2000, help="distinct users per path")
    parser.add_argument("--limit", type=int, default=20, help="?limit= of every read")
    parser.add_argument("--swap-every", type=float, default=3.0)
    parser.add_argument("--soak-seconds", type=float, default=180.0)
    parser.add_argument("--soak-gap", type=float, default=11.0)
    parser.add_argument("--burst", type=int, default=64)
    parser.add_argument(
        "--scenarios",
        default="batch,cold_start,dismissals,switch,soak_sqlite,soak_postgres,ceiling",
        help="comma-separated, in this order",
    )
    args = parser.parse_args(argv)
    scenarios = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    if shutil.which("wrk") is None:
        sys.exit("bench-api: wrk is not installed (Debian: apt-get install -y wrk)")

    home = Path(args.home).resolve()
    _prepare(home)
    work = Path(tempfile.mkdtemp(prefix="recs-bench-api-"))
    run_home, first, second = _run_home(home, work)
    from recs.config import Settings

    settings = Settings(home=run_home)
    batch_users, cold_users, active = _pick_users(settings, args.users, args.limit)
    print(f"{len(batch_users)} batch users, {len(cold_users)} cold-start users", file=sys.stderr)
    secret = secrets.token_hex(32)
    from recs.serving.auth import mint_token

    service = mint_token(secret, 0, service=True, ttl_seconds=3 * 3600)
    files = _write_inputs(work, args, batch_users, cold_users, active, secret)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECS_")}
    env.update(RECS_HOME=str(run_home), RECS_API_JWT_SECRET=secret)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    results: dict[str, dict] = {}
    try:
        with _Server(env, args, work / "server.log") as server:
            runner = _Runner(server, args, files, service)
            for name in scenarios:
                if name == "soak_postgres":
                    continue
                print(f"bench-api: {name} ...", file=sys.stderr)
                if name == "switch":
                    with api_load.Swapper(settings, first, second, args.swap_every) as swapper:
                        results[name] = runner.reads("batch", args.read_rate)
                    results[name]["swaps"] = swapper.swaps
                elif name == "soak_sqlite":
                    results[name] = runner.soak()
                elif name == "dismissals":
                    results[name] = runner.dismissals()
                elif name == "ceiling":
                    results[name] = runner.ceiling()
                else:
                    rate = args.rate if name == "batch" else args.cold_rate
                    results[name] = runner.reads(name, rate)
        if "soak_postgres" in scenarios:
            results["soak_postgres"] = _postgres_soak(env, args, files, service, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    document = {
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0]},
        "settings": vars(args),
        "results": results,
    }
    out = home / "bench" / "api.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    failed = _print_table(document)
    print(f"\nwrote {out}", file=sys.stderr)
    return 1 if failed else 0


# --- the home and its inputs ---------------------------------------------------------------
def _prepare(home: Path) -> None:
    """Load Slashdot and run the pipeline once into the bench's own home (reused after)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECS_")}
    env["RECS_HOME"] = str(home)
    if not (home / "live.db").exists():
        print(f"bench-api: loading soc-Slashdot0902 into {home}", file=sys.stderr)
        subprocess.run([str(BIN / "recs"), "load-dataset", "slashdot", "--replace"], env=env,
                       check=True)  # fmt: skip
    if not (home / "published" / "CURRENT").exists():
        print(f"bench-api: running the pipeline for {DATE}", file=sys.stderr)
        subprocess.run([str(BIN / "recs"), "run", "--snapshot-date", DATE], env=env, check=True)


def _run_home(home: Path, work: Path) -> tuple[Path, str, str]:
    """A working copy of ``home``: the live store backed up, the current version linked, and a
    second version with the same files under the run id ``<run>-b`` (hard links, its own
    manifest). Returns (the copy, first run id, second run id)."""
    from recs.published import current_version

    run_home = work / "home"
    (run_home / "published").mkdir(parents=True)
    with (
        sqlite3.connect(home / "live.db") as source,
        sqlite3.connect(run_home / "live.db") as target,
    ):
        source.backup(target)
    first = current_version(home / "published")
    second = f"{first}-b"
    (run_home / "published" / first).symlink_to(home / "published" / first)
    copy = run_home / "published" / second
    shutil.copytree(home / "published" / first, copy, copy_function=os.link)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["run_id"] = second
    (copy / "manifest.json").unlink()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (run_home / "published" / "CURRENT").write_text(f"{first}\n")
    return run_home, first, second


def _pick_users(settings, how_many: int, limit: int) -> tuple[list[int], list[int], list[int]]:
    """Users the read path answers from the batch list / from cold start, right now, and the
    active users (for dismissal pairs)."""
    from sqlalchemy import select

    from recs.serving.live_store import LiveStore
    from recs.serving.read_path import wall_clock, who_to_follow
    from recs.serving.versions import load_current
    from recs.store.connections import engine_for
    from recs.store.schema import users

    engine = engine_for(settings.live_store_url)
    with engine.connect() as connection:
        active = connection.execute(
            select(users.c.user_id).where(users.c.account_status == "active")
        ).scalars().all()  # fmt: skip
    engine.dispose()
    store = LiveStore(settings.live_store_url)
    version = load_current(settings, eager=True)
    rng = random.Random(7)
    shuffled = list(active)
    rng.shuffle(shuffled)
    batch, cold = [], []
    now = wall_clock()
    for user in shuffled:
        if len(batch) >= how_many and len(cold) >= how_many:
            break
        document = who_to_follow(
            user, limit, version=version, store=store, settings=settings, now=now
        )
        if not document["items"]:
            continue
        chosen = batch if document["source"] == "batch" else cold
        if len(chosen) < how_many:
            chosen.append(user)
    store.close()
    return batch, cold, sorted(active)


def _write_inputs(work, args, batch_users, cold_users, active, secret) -> dict[str, Path]:
    """wrk's Lua scripts, the read paths per source, and the dismissal lines (a distinct
    (user, candidate) pair each, with the user's own token: writes need it)."""
    from recs.serving.auth import mint_token

    files = {"read_script": work / "read.lua", "write_script": work / "write.lua"}
    files["read_script"].write_text(api_load.READ_SCRIPT)
    files["write_script"].write_text(api_load.WRITE_SCRIPT)
    for name, users in (("batch", batch_users), ("cold_start", cold_users)):
        files[name] = work / f"{name}.txt"
        files[name].write_text(
            "".join(f"/v1/users/{u}/who-to-follow?limit={args.limit}\n" for u in users)
        )
    needed = int(args.dismiss_rate * (args.duration + args.warmup + 10)) + args.burst * (
        int(args.soak_seconds / max(args.soak_gap, 1.0)) + 2
    )
    rng = random.Random(11)
    writers = rng.sample(active, min(len(active), 4000))
    tokens = {u: mint_token(secret, u, ttl_seconds=3 * 3600) for u in writers}
    lines, seen = [], set()
    while len(lines) < needed:
        user, candidate = rng.choice(writers), rng.choice(active)
        if user != candidate and (user, candidate) not in seen:
            seen.add((user, candidate))
            body = json.dumps({"candidate_id": candidate})
            lines.append(f"/v1/users/{user}/dismissals\t{tokens[user]}\t{body}")
    files["dismissals"] = work / "dismissals.txt"
    files["dismissals"].write_text("\n".join(lines) + "\n")
    files["soak_reads"] = [(path.strip(), "") for path in files["batch"].read_text().split()]
    return files


# --- the server and the scenarios ----------------------------------------------------------
class _Server:
    """``recs serve`` as a child process in its own process group, stopped on exit."""

    def __init__(self, env: dict, args, log: Path) -> None:
        self.env, self.args, self.log = env, args, log
        self.base = f"http://127.0.0.1:{args.port}"

    def __enter__(self) -> _Server:
        command = [str(BIN / "recs"), "serve", "--host", "127.0.0.1", "--port",
                   str(self.args.port), "--workers", str(self.args.workers)]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            env=self.env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"bench-api: the server exited:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.base}/readyz", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__()
        sys.exit(f"bench-api: the server was not ready in 180 s:\n{self.log.read_text()[-3000:]}")

    def __exit__(self, *_exc) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


class _Runner:
    def __init__(self, server: _Server, args, files: dict, service_token: str) -> None:
        self.server, self.args, self.files, self.token = server, args, files, service_token
        # The soak posts the pairs from the end of the list, the paced run from the start.
        self.writers = reversed(files["dismissals"].read_text().splitlines())

    def _wrk(self, script, data, seconds, delay_ms, connections, extra=()):
        return api_load.wrk_run(
            self.server.base, script, data, seconds=seconds, connections=connections,
            threads=self.args.threads, delay_ms=delay_ms, token=self.token, extra_args=extra,
        )  # fmt: skip

    def _paced(self, script, data, rate, connections, extra=()) -> dict:
        def run(seconds, delay):
            return self._wrk(script, data, seconds, delay, connections, extra)

        delay = api_load.calibrated_delay(
            run, connections=connections, rate=rate, warm_seconds=self.args.warmup
        )
        cpu = api_load.CpuMeter(self.server.process.pid)
        measured = run(self.args.duration, delay)
        measured["cpu"] = cpu.read()
        measured["offered"] = rate
        return measured

    def reads(self, source: str, rate: float) -> dict:
        route = api_load.ROUTE
        before = api_load.server_histogram(self.server.base, self.token, route, source)
        measured = self._paced(
            self.files["read_script"], self.files[source], rate, self.args.connections
        )
        after = api_load.server_histogram(self.server.base, self.token, route, source)
        measured["server"] = api_load.histogram_quantiles(before, after)
        return measured

    def dismissals(self) -> dict:
        """Writes paced at --dismiss-rate while reads run at --read-rate (a second wrk)."""
        reads: dict = {}
        connections = 16
        reader = threading.Thread(
            target=lambda: reads.update(self.reads("batch", self.args.read_rate)), daemon=True
        )
        reader.start()
        writes = self._paced(
            self.files["write_script"], self.files["dismissals"], self.args.dismiss_rate,
            connections, extra=(str(self.args.threads),),
        )  # fmt: skip
        reader.join()
        writes["reads"] = reads
        return writes

    def ceiling(self) -> dict:
        connections = max(self.args.threads * 8, 16)
        return self._wrk(
            self.files["read_script"], self.files["batch"], max(self.args.duration // 3, 5),
            0.0, connections,
        )  # fmt: skip

    def soak(self) -> dict:
        readers = [(path, self.token) for path, _ in self.files["soak_reads"]]
        writers = (line.split("\t") for line in self.writers)
        return api_load.soak(
            self.server.base, readers=readers, writers=writers, seconds=self.args.soak_seconds,
            gap=self.args.soak_gap, burst=self.args.burst,
        )  # fmt: skip


def _postgres_soak(env, args, files, service, work) -> dict:
    """The soak against a PostgreSQL live store with the same dataset (skipped, with a note,
    without PostgreSQL's server binaries)."""
    from recs.testing import pgserver

    if pgserver.find_bindir() is None:
        return {"skipped": "no PostgreSQL server binaries (make postgres-server)"}
    server = pgserver.start(durable=True)
    try:
        url = server.create_database("recs_bench_api")
        load_env = {**env, "RECS_STORE_URL": url, "RECS_HOME": str(work / "pg-home")}
        print("bench-api: loading soc-Slashdot0902 into PostgreSQL ...", file=sys.stderr)
        subprocess.run([str(BIN / "recs"), "load-dataset", "slashdot", "--replace"],
                       env=load_env, check=True, capture_output=True)  # fmt: skip
        print("bench-api: soak_postgres ...", file=sys.stderr)
        with _Server({**env, "RECS_STORE_URL": url}, args, work / "server-pg.log") as api:
            return _Runner(api, args, files, service).soak()
    finally:
        server.stop()


# --- the report ----------------------------------------------------------------------------
def _print_table(document: dict) -> bool:
    """Print one row per scenario (and per kind of request); True if any had an error."""
    settings = document["settings"]
    print(
        f"\nrecs read API on loopback: {settings['workers']} uvicorn workers, "
        f"{document['machine']['cpus']} CPUs, wrk {settings['threads']} threads"
    )
    header = (
        f"{'scenario':<14} {'requests':<10} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'p999 ms':>7} {'max ms':>7} {'errors':>6}  target"
    )
    print(header)
    print("-" * (len(header) + 30))
    failed = False
    for name, result in document["results"].items():
        if "skipped" in result:
            print(f"{name:<14} skipped: {result['skipped']}")
            continue
        for label, row in _rows(name, result):
            errors = row["errors"]
            failed |= errors > 0
            target = ""
            goal = TARGETS.get(name) if label in ("", "writes") else None
            if goal is not None and row.get(goal[0]) is not None:
                met = row[goal[0]] <= goal[1] and errors == 0
                target = f"{goal[2]}: {'met' if met else 'MISSED'}"
            elif name.startswith("soak") or name == "switch":
                target = "0 errors: " + ("met" if errors == 0 else "MISSED")
            print(
                f"{(name + ' ' + label).strip():<14} {row['requests']:<10} "
                f"{_fmt(row.get('rate'), 0):>7} {_fmt(row['p50']):>7} {_fmt(row['p99']):>7} "
                f"{_fmt(row['p999']):>7} {_fmt(row['max']):>7} {errors:>6}  {target}"
            )
        cpu = result.get("cpu")
        if cpu:
            swaps = f"; CURRENT swapped {result['swaps']} times" if result.get("swaps") else ""
            print(
                f"{'':<14} cpu during the run, cores: server {cpu['server_cores']}, wrk "
                f"{cpu['wrk_cores']}, other {cpu['other_cores']}{swaps}"
            )
        server = result.get("server")
        if server:
            print(f"{'':<14} server histogram: p50 <= {server['p50_le_ms']} ms, p99 <= "
                  f"{server['p99_le_ms']} ms, p999 <= {server['p999_le_ms']} ms")  # fmt: skip
    return failed


def _rows(name: str, result: dict):
    if "bursts" in result:  # a soak
        for kind in ("read", "write"):
            part = result[kind]
            yield f"{kind}s", {
                "requests": part["requests"], "rate": None, "p50": part["p50_ms"],
                "p99": part["p99_ms"], "p999": part["p999_ms"], "max": part["max_ms"],
                "errors": part["errors"],
            }  # fmt: skip
        return
    yield ("writes" if name == "dismissals" else ""), _wrk_row(result)
    if "reads" in result and result["reads"]:
        yield "reads", _wrk_row(result["reads"])


def _wrk_row(run: dict) -> dict:
    latency = run["latency_us"]
    return {
        "requests": run["requests"],
        "rate": run["req_per_s"],
        "p50": latency["p50"] / 1000,
        "p99": latency["p99"] / 1000,
        "p999": latency["p999"] / 1000,
        "max": latency["max"] / 1000,
        "errors": sum(run["errors"].values()) + run["sources"]["other"],
    }


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
