"""The read API's Prometheus metrics, process-wide (exported by ``/metrics``).

With several worker processes the Prometheus client's multiprocess mode aggregates them
(``PROMETHEUS_MULTIPROC_DIR``, set by ``recs serve``). Names follow the Prometheus
conventions (``_total`` is added to counters by the client). The drop and fail-open counters
are the design document's stale-edge and ``FailOpenHandler`` counters (doc 004).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUEST_SECONDS = Histogram(
    "recs_api_request_duration_seconds",
    "Time from request received to response sent, by route template and source.",
    ["path", "source"],
    buckets=(
        0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
        0.075, 0.1, 0.15, 0.3, 0.5, 1.0, 2.5,
    ),
)  # fmt: skip
REQUESTS = Counter(
    "recs_api_requests", "Requests answered, by route template, method and status.",
    ["path", "method", "status"],
)  # fmt: skip
DROPPED = Counter(
    "recs_api_dropped_candidates",
    "Candidates dropped at read time, by path (batch, cold_start) and reason.",
    ["source", "reason"],
)
FOLLOWED_BY_DROPPED = Counter(
    "recs_api_followed_by_dropped",
    "'Followed by' ids omitted at read time (the user no longer follows them).",
    ["reason"],
)
COLD_START = Counter(
    "recs_api_cold_start", "Requests answered from the cold-start path, by why.", ["reason"]
)
FILLED = Counter(
    "recs_api_filled_items",
    "Cold-start items appended to batch lists shorter than the request (fill_short_lists).",
)
FAIL_OPEN = Counter(
    "recs_api_fail_open",
    "Fail-open checks skipped because the live store failed (the list was served unchecked).",
    ["check"],
)
STORE_ERRORS = Counter(
    "recs_api_store_errors", "Live-store operations that failed, by operation.", ["operation"]
)
STORE_RECONNECTS = Counter(
    "recs_api_store_reconnects",
    "Times the live store's connections were dropped and reopened, by why (replaced: the "
    "SQLite file or PostgreSQL database is another one; disconnected: the server closed them).",
    ["reason"],
)
HTTP_REFUSED = Counter(
    "recs_api_http_refused",
    "Connections closed by the HTTP limits before a request reached the app, by limit.",
    ["limit"],
)
VERSION_INFO = Gauge(
    "recs_api_published_version_info",
    "1 for the published run_id this process serves, 0 for one it served before.",
    ["run_id"],
    multiprocess_mode="liveall",
)
VERSION_SWAPS = Counter("recs_api_version_swaps", "Published versions switched to.")
VERSION_LOAD_FAILURES = Counter(
    "recs_api_version_load_failures", "Published versions that failed to load (old one kept)."
)
VERSION_LOAD_SECONDS = Histogram(
    "recs_api_version_load_seconds",
    "Seconds to load and index one published version.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
