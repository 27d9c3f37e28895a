"""Load-test the read API on loopback with wrk: throughput and p50/p99/p999 by path.

What it does (``make bench-api``; ``--help`` for the knobs):

1. Makes sure ``RECS_HOME`` holds a published Slashdot run (loads soc-Slashdot0902 and runs
   the pipeline for 2026-11-01 only if there is no live store / nothing published).
2. Picks ``--users`` users per path by asking the read path itself (``read_path.who_to_follow``
   in this process, before the server starts): *batch* users are answered from the batch list,
   *cold_start* users from the cold-start path (new or thin accounts, or no batch row).
3. Starts ``recs serve --workers N`` on 127.0.0.1 with a throwaway secret, waits for
   ``/readyz``, mints a service token.
4. For each path: a warm-up, then ``--duration`` seconds of wrk at a fixed offered rate
   (``--rate``, default 1,000 req/s): ``--connections`` connections, each waiting an
   exponentially distributed think time between requests (mean ``connections / rate``), so
   arrivals are close to Poisson rather than synchronised bursts. wrk 4 times each request
   from send to last byte; it is closed-loop per connection, so a server stall would delay
   the next requests of the busy connections rather than count against them (coordinated
   omission) -- with 64 connections each idle ~98 % of the time that hides little, and the
   server-side histogram (``/metrics``) is printed beside it as a cross-check.
   Then (unless ``--no-saturate``) a closed-loop run without think time: the ceiling.
5. Prints one table and writes ``<RECS_HOME>/bench/api.json``; every response's ``source`` is
   counted by the wrk script, and any non-2xx answer or socket error is reported, with the CPU
   used meanwhile by the server, by wrk and by anything else (a shared machine shows there).
   ``--swap-with RUN_ID`` flips ``CURRENT`` between two versions during the paced runs.

The server is a child process in its own process group, stopped at the end (also on error).
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
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent
ROUTE = "/v1/users/{user_id}/who-to-follow"
DATE = "2026-11-01"

WRK_SCRIPT = r"""
-- recs bench-api: paced GETs over a file of paths, with a bearer token (wrk 4 Lua API).
local paths = {}
local threads = {}
local token = os.getenv("RECS_BENCH_TOKEN")
local mean_delay_ms = tonumber(os.getenv("RECS_BENCH_DELAY_MS") or "0")
local cursor = 0

function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end

function init(args)
  for line in io.lines(args[1]) do paths[#paths + 1] = line end
  math.randomseed(1000 + id)
  cursor = math.random(#paths)
  wrk.headers["Authorization"] = "Bearer " .. token
  batch, cold, other = 0, 0, 0
end

function request()
  cursor = cursor % #paths + 1
  return wrk.format("GET", paths[cursor])
end

function delay()
  if mean_delay_ms <= 0 then return 0 end
  return math.floor(-mean_delay_ms * math.log(1 - math.random()) + 0.5)
end

function response(status, headers, body)
  if body:find('"source":"batch"', 1, true) then batch = batch + 1
  elseif body:find('"source":"cold_start"', 1, true) then cold = cold + 1
  else other = other + 1 end
end

function done(summary, latency, requests)
  local b, c, o = 0, 0, 0
  for _, t in ipairs(threads) do
    b = b + t:get("batch"); c = c + t:get("cold"); o = o + t:get("other")
  end
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests": %d, "duration_us": %d, "errors": {"connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d}, "latency_us": {"p50": %d, "p90": %d, ' ..
    '"p99": %d, "p999": %d, "max": %d, "mean": %.1f}, "sources": {"batch": %d, ' ..
    '"cold_start": %d, "other": %d}}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean, b, c, o))
end
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="offered req/s per path")
    parser.add_argument("--duration", type=int, default=30, help="seconds per measured run")
    parser.add_argument("--warmup", type=int, default=5, help="seconds of warm-up per path")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--port", type=int, default=8799)
    parser.add_argument("--users", type=int, default=2000, help="distinct users per path")
    parser.add_argument("--limit", type=int, default=20, help="?limit= of every request")
    parser.add_argument("--no-saturate", action="store_true", help="skip the ceiling runs")
    parser.add_argument(
        "--swap-with",
        metavar="RUN_ID",
        help="another published version: during each paced run CURRENT alternates between it "
        "and the current one every --swap-every seconds (hot swap under load; restored after)",
    )
    parser.add_argument("--swap-every", type=float, default=3.0)
    args = parser.parse_args(argv)

    if shutil.which("wrk") is None:
        sys.exit("bench-api: wrk is not installed (Debian: apt-get install -y wrk)")
    from recs.config import Settings

    settings = Settings()
    home = settings.home.resolve()
    _ensure_published(settings)
    batch_users, cold_users = _pick_users(settings, args.users, args.limit)
    print(
        f"home {home}: {len(batch_users)} batch users, {len(cold_users)} cold-start users",
        file=sys.stderr,
    )
    work = Path(tempfile.mkdtemp(prefix="recs-bench-api-"))
    script = work / "paced.lua"
    script.write_text(WRK_SCRIPT)
    path_files = {}
    for name, users in (("batch", batch_users), ("cold_start", cold_users)):
        path_files[name] = work / f"{name}.txt"
        path_files[name].write_text(
            "".join(f"/v1/users/{u}/who-to-follow?limit={args.limit}\n" for u in users)
        )

    secret = os.environ.get("RECS_API_JWT_SECRET") or secrets.token_hex(32)
    env = {**os.environ, "RECS_HOME": str(home), "RECS_API_JWT_SECRET": secret}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    from recs.serving.auth import mint_token

    token = mint_token(secret, 0, service=True, ttl_seconds=3600)
    base = f"http://127.0.0.1:{args.port}"
    log_path = work / "server.log"
    server = subprocess.Popen(
        [str(BIN / "recs"), "serve", "--host", "127.0.0.1", "--port", str(args.port),
         "--workers", str(args.workers)],
        env=env, stdout=log_path.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    results = {}
    try:
        _wait_ready(base, server, log_path)
        for name in ("batch", "cold_start"):
            wrk = _wrk_runner(base, script, path_files[name], token, args)
            # Calibrate the think time on the warm-up: each connection's cycle is think time +
            # round trip + wrk's own overhead; solve for the think time that offers 2 % more
            # than --rate, so that the measured rate is at least --rate.
            first = args.connections * 1000.0 / args.rate
            warm = wrk(args.warmup, args.rate, paced=True, delay_ms=first)
            overhead = args.connections * 1000.0 / warm["req_per_s"] - first
            think = max(args.connections * 1000.0 / (1.02 * args.rate) - overhead, 0.0)
            before = _server_histogram(base, name, token)
            cpu = _CpuMeter(server.pid)
            with _Swapper(settings, args.swap_with, args.swap_every) as swapper:
                measured = wrk(args.duration, args.rate, paced=True, delay_ms=think)
            measured["cpu"] = cpu.read()
            measured["swaps"] = swapper.swaps
            after = _server_histogram(base, name, token)
            entry = {"paced": measured, "server": _histogram_quantiles(before, after)}
            if not args.no_saturate:
                entry["ceiling"] = wrk(max(args.duration // 3, 5), 0, paced=False)
            results[name] = entry
    finally:
        _stop(server)
    document = {
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "home": str(home),
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0]},
        "settings": vars(args),
        "results": results,
    }
    out = home / "bench" / "api.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    _print_table(document)
    print(f"\nwrote {out}", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    failed = any(
        sum(run["errors"].values()) or run["sources"]["other"]
        for entry in results.values()
        for key, run in entry.items()
        if key in ("paced", "ceiling")
    )
    return 1 if failed else 0


def _ensure_published(settings) -> None:
    """A Slashdot run under RECS_HOME, made only if there is no store or nothing published."""
    from recs.published import current_version

    env = {**os.environ, "RECS_HOME": str(settings.home.resolve())}
    if not (settings.home / "live.db").exists():
        print("bench-api: no live store here: loading soc-Slashdot0902", file=sys.stderr)
        subprocess.run([str(BIN / "recs"), "load-dataset", "slashdot", "--replace"], env=env,
                       check=True)  # fmt: skip
    if current_version(settings.published_dir) is None:
        print(f"bench-api: nothing published: running the pipeline for {DATE}", file=sys.stderr)
        subprocess.run([str(BIN / "recs"), "run", "--snapshot-date", DATE], env=env, check=True)


def _pick_users(settings, how_many: int, limit: int) -> tuple[list[int], list[int]]:
    """Users the read path answers from the batch list / from cold start, right now."""
    import numpy as np
    import pyarrow.parquet as pq

    from recs.published import current_version
    from recs.serving.live_store import LiveStore
    from recs.serving.read_path import wall_clock, who_to_follow
    from recs.serving.versions import load_current

    run_id = current_version(settings.published_dir)
    root = settings.published_dir / run_id
    with_rows = set()
    for path in sorted(root.glob("shard_id=*/recommendations.parquet")):
        with_rows.update(np.unique(pq.read_table(path, columns=["user_id"])["user_id"]).tolist())
    store = LiveStore(settings.live_store_url)
    version = load_current(settings, eager=True)
    rng = random.Random(7)
    from sqlalchemy import select

    from recs.store.connections import engine_for
    from recs.store.schema import users

    engine = engine_for(settings.live_store_url)
    with engine.connect() as connection:
        active = (
            connection.execute(select(users.c.user_id).where(users.c.account_status == "active"))
            .scalars()
            .all()
        )
    engine.dispose()
    rng.shuffle(active)
    batch, cold = [], []
    now = wall_clock()
    for user in active:
        if len(batch) >= how_many and len(cold) >= how_many:
            break
        wanted = "batch" if user in with_rows else "cold_start"
        if (len(batch) if wanted == "batch" else len(cold)) >= how_many:
            continue
        document = who_to_follow(
            user, limit, version=version, store=store, settings=settings, now=now
        )
        if document["items"]:
            (batch if document["source"] == "batch" else cold).append(user)
    store.close()
    return batch[:how_many], cold[:how_many]


def _wait_ready(base: str, server: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"bench-api: the server exited:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"bench-api: the server was not ready in 180 s:\n{log_path.read_text()[-3000:]}")


def _wrk_runner(base, script, paths_file, token, args):
    def run(seconds: int, rate: float, *, paced: bool, delay_ms: float | None = None) -> dict:
        connections = args.connections if paced else max(args.threads * 8, 16)
        if paced and delay_ms is None:
            delay_ms = connections * 1000.0 / rate
        env = {
            **os.environ,
            "RECS_BENCH_TOKEN": token,
            "RECS_BENCH_DELAY_MS": f"{delay_ms:.3f}" if paced else "0",
        }
        command = [
            "wrk", "-t", str(args.threads), "-c", str(connections), "-d", f"{seconds}s",
            "--timeout", "5s", "-s", str(script), f"{base}/", "--", str(paths_file),
        ]  # fmt: skip
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=seconds + 60
        )
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"bench-api: wrk failed:\n{done.stdout}\n{done.stderr}")
        result = json.loads(line[len("RESULT ") :])
        result["connections"] = connections
        result["req_per_s"] = result["requests"] / (result["duration_us"] / 1e6)
        result["think_ms_mean"] = round(delay_ms or 0.0, 3)
        return result

    return run


def _server_histogram(base: str, source: str, token: str) -> dict[float, float]:
    """Cumulative bucket counts of the server's request histogram for one source (/metrics
    needs the service token)."""
    request = urllib.request.Request(
        f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        text = response.read().decode()
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith("recs_api_request_duration_seconds_bucket{"):
            continue
        labels, value = line.rsplit(" ", 1)
        if f'path="{ROUTE}"' not in labels or f'source="{source}"' not in labels:
            continue
        bound = labels.split('le="', 1)[1].split('"', 1)[0]
        upper = float("inf") if bound == "+Inf" else float(bound)
        buckets[upper] = buckets.get(upper, 0.0) + float(value)  # summed over workers
    return buckets


def _histogram_quantiles(before: dict, after: dict) -> dict:
    """Bucket upper bounds (ms) holding the 50th/99th/99.9th percentile of the requests
    observed between two scrapes (server side: arrival to last byte sent)."""
    counts = sorted((bound, after.get(bound, 0.0) - before.get(bound, 0.0)) for bound in after)
    total = counts[-1][1] if counts else 0.0
    out = {"requests": int(total)}
    for name, q in (("p50_le_ms", 0.5), ("p99_le_ms", 0.99), ("p999_le_ms", 0.999)):
        bound = next((b for b, c in counts if total and c >= q * total), None)
        out[name] = None if bound is None else (bound * 1e3 if bound != float("inf") else "inf")
    return out


class _CpuMeter:
    """CPU seconds used during a run, in cores: by the server (all its processes), by wrk (our
    waited children) and by everything else on the machine -- other work on a shared machine
    shows up as ``other`` and explains a disturbed run."""

    def __init__(self, server_pid: int) -> None:
        import resource

        import psutil

        self._server = psutil.Process(server_pid)
        self._resource = resource
        self._started = time.monotonic()
        self._machine = self._busy()
        self._server_cpu = self._server_seconds()
        self._children = self._children_seconds()

    def _busy(self) -> float:
        import psutil

        times = psutil.cpu_times()
        return sum(times) - times.idle - getattr(times, "iowait", 0.0)

    def _server_seconds(self) -> float:
        import psutil

        total = 0.0
        for process in [self._server, *self._server.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    def _children_seconds(self) -> float:
        usage = self._resource.getrusage(self._resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def read(self) -> dict:
        elapsed = time.monotonic() - self._started
        machine = self._busy() - self._machine
        server = self._server_seconds() - self._server_cpu
        wrk = self._children_seconds() - self._children
        return {
            "server_cores": round(server / elapsed, 2),
            "wrk_cores": round(wrk / elapsed, 2),
            "other_cores": round(max(machine - server - wrk, 0.0) / elapsed, 2),
        }


class _Swapper:
    """Alternate ``CURRENT`` between the current version and ``other`` in a thread (with
    ``publish.set_current``: checked, atomic), restoring the original on exit."""

    def __init__(self, settings, other: str | None, every: float) -> None:
        import threading

        self.settings, self.other, self.every = settings, other, every
        self.swaps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        if self.other:
            from recs.published import current_version

            self.original = current_version(self.settings.published_dir)
            self._thread.start()
        return self

    def _run(self) -> None:
        from recs.nightly.publish import set_current

        targets = [self.other, self.original]
        while not self._stop.wait(self.every):
            set_current(self.settings, targets[self.swaps % 2])
            self.swaps += 1

    def __exit__(self, *_exc) -> None:
        if self.other:
            from recs.nightly.publish import set_current

            self._stop.set()
            self._thread.join()
            set_current(self.settings, self.original)


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)  # our own child's process group
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)


def _print_table(document: dict) -> None:
    ms = lambda us: f"{us / 1000:7.2f}"  # noqa: E731
    print(
        f"\nrecs read API on loopback: {document['settings']['workers']} uvicorn workers, "
        f"{document['machine']['cpus']} CPUs, wrk {document['settings']['threads']} threads"
    )
    header = (
        f"{'path':<11} {'run':<8} {'conns':>5} {'req/s':>8} {'p50 ms':>7} {'p90 ms':>7} "
        f"{'p99 ms':>7} {'p999 ms':>7} {'max ms':>7} {'errors':>6}  sources"
    )
    print(header)
    print("-" * len(header))
    for name, entry in document["results"].items():
        for kind in ("paced", "ceiling"):
            run = entry.get(kind)
            if run is None:
                continue
            lat = run["latency_us"]
            sources = ", ".join(f"{k} {v}" for k, v in run["sources"].items() if v)
            print(
                f"{name:<11} {kind:<8} {run['connections']:>5} {run['req_per_s']:>8.0f} "
                f"{ms(lat['p50'])} {ms(lat['p90'])} {ms(lat['p99'])} {ms(lat['p999'])} "
                f"{ms(lat['max'])} {sum(run['errors'].values()):>6}  {sources}"
            )
        server = entry["server"]
        print(
            f"{'':<11} {'server':<8} {'':>5} {'':>8} "
            f"p50 <= {server['p50_le_ms']} ms, p99 <= {server['p99_le_ms']} ms, "
            f"p999 <= {server['p999_le_ms']} ms (histogram buckets, {server['requests']} req)"
        )
        cpu = entry["paced"]["cpu"]
        swaps = entry["paced"].get("swaps")
        print(
            f"{'':<11} {'cpu':<8} {'':>5} {'':>8} during the paced run, in cores: server "
            f"{cpu['server_cores']}, wrk {cpu['wrk_cores']}, other processes "
            f"{cpu['other_cores']}" + (f"; CURRENT swapped {swaps} times" if swaps else "")
        )


if __name__ == "__main__":
    sys.exit(main())
