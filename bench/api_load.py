"""Load generators of ``bench/api.py``: paced wrk runs (reads, dismissal writes) and the soak
client (bursts with idle gaps), plus the CPU meter and the ``CURRENT`` swapper.

wrk 4 times each request from send to last byte. It is closed-loop per connection: each
connection waits an exponentially distributed think time between requests (mean
``connections / rate``), so arrivals are close to Poisson; a server stall delays the next
requests of the busy connections rather than counting against them (coordinated omission) --
with 64 connections each idle ~95 % of the time that hides little, and the server-side
histogram (``/metrics``) is printed beside it as a cross-check.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROUTE = "/v1/users/{user_id}/who-to-follow"

_COMMON = r"""
local threads = {}
local mean_delay_ms = tonumber(os.getenv("RECS_BENCH_DELAY_MS") or "0")
local cursor = 0

function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end

function delay()
  if mean_delay_ms <= 0 then return 0 end
  return math.floor(-mean_delay_ms * math.log(1 - math.random()) + 0.5)
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

READ_SCRIPT = _COMMON + (
    r"""
-- recs bench-api: paced GETs over a file of paths, with a bearer token.
local paths = {}
local token = os.getenv("RECS_BENCH_TOKEN")

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

function response(status, headers, body)
  if body:find('"source":"batch"', 1, true) then batch = batch + 1
  elseif body:find('"source":"cold_start"', 1, true) then cold = cold + 1
  else other = other + 1 end
end
"""
)

WRITE_SCRIPT = _COMMON + (
    r"""
-- recs bench-api: paced dismissals; each line of the file is "path<TAB>token<TAB>body", every
-- thread takes its own slice so no pair is posted twice.
local lines = {}

function init(args)
  local index, count = 0, tonumber(args[2])
  for line in io.lines(args[1]) do
    if index % count == id - 1 then lines[#lines + 1] = line end
    index = index + 1
  end
  batch, cold, other = 0, 0, 0
end

function request()
  cursor = cursor % #lines + 1
  local path, token, body = lines[cursor]:match("([^\t]+)\t([^\t]+)\t(.+)")
  return wrk.format("POST", path, {["Authorization"] = "Bearer " .. token,
                                    ["Content-Type"] = "application/json"}, body)
end

function response(status, headers, body)
  if status == 201 or status == 200 then batch = batch + 1 else other = other + 1 end
end
"""
)


def wrk_run(base, script: Path, data_file: Path, *, seconds, connections, threads, delay_ms,
            token="", extra_args=()) -> dict:  # fmt: skip
    """One wrk run, each connection thinking ``delay_ms`` on average between its requests (0:
    closed loop). Returns wrk's summary (requests, errors, latency percentiles in µs) plus
    ``req_per_s``."""
    env = {**os.environ, "RECS_BENCH_TOKEN": token, "RECS_BENCH_DELAY_MS": f"{delay_ms:.3f}"}
    command = [
        "wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s",
        "--timeout", "5s", "-s", str(script), f"{base}/", "--", str(data_file), *extra_args,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=seconds + 60)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"bench-api: wrk failed:\n{done.stdout}\n{done.stderr}")
    result = json.loads(line[len("RESULT ") :])
    result["connections"] = connections
    result["req_per_s"] = result["requests"] / (result["duration_us"] / 1e6)
    result["think_ms_mean"] = round(delay_ms, 3)
    return result


def calibrated_delay(run, *, connections: int, rate: float, warm_seconds: int) -> float:
    """The mean think time (ms) at which ``connections`` connections offer ``rate`` req/s: a
    warm-up at the nominal think time measures each cycle's overhead (round trip + wrk), which
    is then taken off, aiming 2 % high so the achieved rate is at least ``rate``."""
    nominal = connections * 1000.0 / rate
    warm = run(warm_seconds, nominal)
    overhead = connections * 1000.0 / max(warm["req_per_s"], 1.0) - nominal
    return max(connections * 1000.0 / (1.02 * rate) - overhead, 0.0)


def server_histogram(base: str, token: str, route: str, source: str | None) -> dict:
    """Cumulative bucket counts of the server's request histogram for a route (and source),
    summed over workers (``/metrics`` needs a service token)."""
    headers = {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"{base}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        text = response.read().decode()
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith("recs_api_request_duration_seconds_bucket{"):
            continue
        labels, value = line.rsplit(" ", 1)
        if f'path="{route}"' not in labels:
            continue
        if source is not None and f'source="{source}"' not in labels:
            continue
        bound = labels.split('le="', 1)[1].split('"', 1)[0]
        upper = float("inf") if bound == "+Inf" else float(bound)
        buckets[upper] = buckets.get(upper, 0.0) + float(value)
    return buckets


def histogram_quantiles(before: dict, after: dict) -> dict:
    """Bucket upper bounds (ms) holding the 50th/99th/99.9th percentile of the requests
    observed between two scrapes (server side: arrival to last byte sent)."""
    counts = sorted((bound, after.get(bound, 0.0) - before.get(bound, 0.0)) for bound in after)
    total = counts[-1][1] if counts else 0.0
    out = {"requests": int(total)}
    for name, q in (("p50_le_ms", 0.5), ("p99_le_ms", 0.99), ("p999_le_ms", 0.999)):
        bound = next((b for b, c in counts if total and c >= q * total), None)
        out[name] = None if bound is None else (bound * 1e3 if bound != float("inf") else "inf")
    return out


class CpuMeter:
    """CPU used during a run, in cores: by the server (all its processes), by our waited
    children (wrk) and by everything else on the machine (a shared machine shows there)."""

    def __init__(self, server_pid: int) -> None:
        import psutil

        self._psutil = psutil
        self._server = psutil.Process(server_pid)
        self._started = time.monotonic()
        self._machine = self._busy()
        self._server_cpu = self._server_seconds()
        self._children = self._children_seconds()

    def _busy(self) -> float:
        times = self._psutil.cpu_times()
        return sum(times) - times.idle - getattr(times, "iowait", 0.0)

    def _server_seconds(self) -> float:
        total = 0.0
        for process in [self._server, *self._server.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except self._psutil.Error:
                continue
            total += times.user + times.system
        return total

    @staticmethod
    def _children_seconds() -> float:
        import resource

        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
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


class Swapper:
    """Alternate ``CURRENT`` between two versions every ``every`` seconds in a thread
    (``publish.set_current``: checked, atomic), restoring the first on exit."""

    def __init__(self, settings, first: str, second: str, every: float) -> None:
        self.settings, self.targets, self.every = settings, [second, first], every
        self.swaps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def _run(self) -> None:
        from recs.nightly.publish import set_current

        while not self._stop.wait(self.every):
            set_current(self.settings, self.targets[self.swaps % 2])
            self.swaps += 1

    def __exit__(self, *_exc) -> None:
        from recs.nightly.publish import set_current

        self._stop.set()
        self._thread.join()
        set_current(self.settings, self.targets[1])


def soak(base: str, *, readers: list[tuple[str, str]], writers, seconds: float, gap: float,
         burst: int) -> dict:  # fmt: skip
    """Bursts of ``burst`` concurrent reads and ``burst`` concurrent dismissals, ``gap``
    seconds apart, for ``seconds``. ``readers``: ``(path, token)``; ``writers``: an iterator
    of ``(path, token, body)``. Returns per kind the count, errors and latency percentiles
    (ms, client side, each request from send to last byte)."""
    import httpx

    async def run() -> dict:
        results = {"read": [], "write": []}
        errors = {"read": [], "write": []}
        cycle = itertools.cycle(readers)
        started = time.monotonic()
        bursts = 0
        limits = httpx.Limits(max_connections=2 * burst)
        async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:

            async def one(kind, method, path, token, body=None):
                begun = time.perf_counter()
                try:
                    response = await client.request(
                        method, path, headers={"Authorization": f"Bearer {token}"},
                        content=body, timeout=30,
                    )  # fmt: skip
                    ok = 200 <= response.status_code < 300
                    detail = f"{response.status_code} {response.text[:120]}"
                except httpx.HTTPError as error:
                    ok, detail = False, repr(error)
                results[kind].append((time.perf_counter() - begun) * 1e3)
                if not ok:
                    errors[kind].append(detail)

            while time.monotonic() - started < seconds:
                tasks = [one("read", "GET", *next(cycle)) for _ in range(burst)]
                tasks += [
                    one("write", "POST", path, token, body.encode())
                    for path, token, body in itertools.islice(writers, burst)
                ]
                await asyncio.gather(*tasks)
                bursts += 1
                await asyncio.sleep(gap)
        return {"bursts": bursts, **{k: _summary(results[k], errors[k]) for k in results}}

    return asyncio.run(run())


def _summary(latencies_ms: list[float], errors: list[str]) -> dict:
    ordered = sorted(latencies_ms)

    def pick(q: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)], 2)

    return {
        "requests": len(ordered),
        "errors": len(errors),
        "first_errors": errors[:3],
        "p50_ms": pick(0.5),
        "p99_ms": pick(0.99),
        "p999_ms": pick(0.999),
        "max_ms": round(ordered[-1], 2) if ordered else None,
    }
