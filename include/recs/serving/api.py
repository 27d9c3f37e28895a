"""The read API: FastAPI over ``recs.serving``, served by uvicorn (``recs serve``).

Endpoints (JSON; every error is ``{"detail": "<one line>"}``):

``GET /v1/users/{user_id}/who-to-follow?limit=20``
    The user's list (``serving.who_to_follow``: ``user_id, source, run_id, generated_at,
    cold_start_reason, items[candidate_id, rank, score, mutual_count, followed_by{ids,
    others}]``).
``POST /v1/users/{user_id}/dismissals`` with ``{"candidate_id": N}``
    Record a dismissal: 201 (200 if it already existed) once it is committed to the live store.
``DELETE /v1/users/{user_id}/dismissals/{candidate_id}``
    Undo it: 204, or 404 if there was none.
``GET /healthz`` (the process answers), ``GET /readyz`` (200 once a published version is
loaded, else 503): both open, for liveness and readiness probes. ``GET /metrics`` (Prometheus
text) needs a service-role bearer token unless ``api_metrics_public``.

Ids in paths (``user_id``, ``candidate_id``) are canonical decimal only: ``0`` or
``[1-9][0-9]*`` up to ``2**63 - 1`` (``recs.auth.parse_id``); ``01``, `` 1``, ``+1``, ``1e3``
are 400, not user 1. The body's ``candidate_id`` must be a JSON integer (not ``true``,
``1.0``, ``"1"`` or ``-0``). ``limit`` is canonical decimal too, given at most once
(``read_path.parse_limit``). Request bodies are limited to ``api_max_body_bytes`` (16 KiB):
a larger ``Content-Length`` is refused before anything is read, a chunked body as soon as it
grows past the limit (``_BodyLimit``).

Status codes: 400 malformed id, limit, body or Content-Length; 401 no/invalid/expired bearer
token (with ``WWW-Authenticate: Bearer``); 403 a token for another user (``recs.auth`` rules),
or a user token on /metrics; 404 unknown or inactive user, unknown candidate, no such
dismissal; 408 a body chunk slower than ``api_body_timeout_seconds`` (and, from the server,
headers slower than ``api_header_timeout_seconds``); 413 request body over
``api_max_body_bytes``; 431 headers over ``api_max_header_bytes`` (``serving.server``); 503 the
live store failed or timed out a check that must not fail open (reads) or a write, or too many
connections (``api_max_connections``).

Concurrency: handlers are ``async``. With the default SQLite live store a request's few point
queries take tens of microseconds, less than a hop to a thread pool, so reads run on the event
loop; with a networked store (``LiveStore.is_local`` false) they run in a store thread pool of
``api_store_connections`` threads, as writes always do (a dismissal waits for an fsync). Work in
that pool that gets no answer within twice ``api_store_timeout_ms`` is answered 503 (a stopped
server cannot enforce its own statement timeout); ``/healthz`` never touches the store. Each
request holds one pooled connection at most, returned when it ends (``LiveStore.session``).
One worker process is one event loop; ``recs serve --workers N`` runs N processes that agree on
the served version (``serving.coordination``); Prometheus' multiprocess mode sums their metrics.

Metrics: ``recs_api_request_duration_seconds{path,source}`` (histogram; ``path`` is the route
template, ``source`` ``batch``/``cold_start`` or ``-``), ``recs_api_requests_total{path,method,
status}`` and the serving counters (``recs.serving``: dropped by reason, cold starts by reason,
fail-open checks, store errors and reconnects, the loaded ``run_id``, version swaps and load
failures, connections refused by the HTTP limits). ``/docs`` serves Swagger UI from local files
(``fastapi-offline``), so it works without internet access.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from starlette.routing import Match

from recs.config import Settings, get_settings
from recs.contracts import MAX_USER_ID
from recs.errors import InvalidRequestError, RecsError, StoreUnavailableError, quoted
from recs.serving import read_path
from recs.serving.auth import (
    VerifiedTokens,
    check_read,
    check_service,
    check_write,
    parse_id,
    secret_of,
)
from recs.serving.coordination import SharedPointer
from recs.serving.live_store import LiveStore
from recs.serving.metrics import REQUEST_SECONDS, REQUESTS, STORE_ERRORS
from recs.serving.versions import VersionCache
from recs.times import utc_iso

log = logging.getLogger("recs.api")

WHO_TO_FOLLOW_PATH = "/v1/users/{user_id}/who-to-follow"


class _RequestMetrics:
    """Pure ASGI middleware timing each request from its arrival to its last byte sent.

    (Starlette's ``BaseHTTPMiddleware`` costs ~100 µs a request; this costs a few.) The
    route template comes from ``scope["route"]`` (set by the router), the source from
    ``request.state.source`` (set by the who-to-follow handler)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_watch(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            source = (scope.get("state") or {}).get("source", "-")
            REQUEST_SECONDS.labels(path, source).observe(time.perf_counter() - started)
            REQUESTS.labels(path, scope.get("method", ""), str(status)).inc()


class RequestTooLargeError(InvalidRequestError):
    """A request body over ``api_max_body_bytes``."""

    http_status = 413


class RequestTimeoutError(InvalidRequestError):
    """A request body chunk that did not arrive within ``api_body_timeout_seconds``."""

    http_status = 408


class _BodyLimit:
    """Pure ASGI middleware bounding request bodies to ``max_bytes`` before they are read.

    A ``Content-Length`` over the limit is answered 413 at once (the body is never pulled
    from the server, which discards it), a malformed one 400. In every case (chunked bodies
    have no Content-Length) the ``receive`` the app sees counts the bytes and raises
    ``RequestTooLargeError`` (413, through the app's error handler) when a chunk takes the
    total past the limit, so at most ``max_bytes`` plus one server chunk (uvicorn: <= 64 KiB)
    is ever held. Each chunk must arrive within ``timeout_seconds`` (``RequestTimeoutError``,
    408), until the body is complete. Early refusals are counted by ``_RequestMetrics`` under
    path ``unmatched`` (no route has been resolved yet)."""

    def __init__(self, app, max_bytes: int, timeout_seconds: float = 10.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_seconds = timeout_seconds

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None:
            refusal = None
            if not declared.isdigit():
                text = declared.decode("latin-1")
                refusal = InvalidRequestError(f"invalid Content-Length header {quoted(text)}")
            elif len(declared) > 15 or int(declared) > self.max_bytes:  # 15 digits: < 1 PB
                refusal = self._too_large()
            if refusal is not None:
                response = _error(refusal)
                response.headers["Connection"] = "close"
                await response(scope, receive, send)
                return
        # Counted whatever Content-Length said: a server that let a chunked body override it
        # must still not get past the limit.
        received = 0
        limit = self.max_bytes
        complete = False

        async def bounded_receive():
            nonlocal received, complete
            if complete:  # after the body: a wait for the disconnect, unbounded
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout_seconds)
            except TimeoutError:
                raise RequestTimeoutError(
                    f"request body not received within {self.timeout_seconds} s "
                    "(api_body_timeout_seconds)"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise self._too_large()
                complete = not message.get("more_body", False)
            return message

        await self.app(scope, bounded_receive, send)

    def _too_large(self) -> RequestTooLargeError:
        return RequestTooLargeError(
            f"request body too large: the limit is {self.max_bytes:,} bytes (api_max_body_bytes)"
        )


class _PlainRoute(APIRoute):
    """A route whose endpoint is called with the ``Request`` and returns the ``Response`` as is.

    Every handler here reads its own path, query and body values (``parse_id``,
    ``parse_limit``) and encodes its own JSON, so FastAPI's per-request dependency solving and
    response serialisation (``get_request_handler``: 9 % of a who-to-follow request under
    cProfile) are skipped; the routes' OpenAPI documentation (``openapi_extra``,
    ``responses``) is built from the declaration as before. FastAPI documents this extension
    point ("Custom Request and APIRoute class")."""

    def get_route_handler(self):
        return self.endpoint


class _DirectRoutes:
    """Pure ASGI middleware calling the endpoint of the matching ``_PlainRoute`` itself.

    A request for one of the API's own routes (matched by each route's own ``matches``, as
    Starlette's router does) skips the rest of the stack: Starlette's exception middleware,
    FastAPI's exit-stack middleware, the router's scan and the two per-request exit stacks of
    FastAPI's ``request_response``, which none of these handlers uses (``/healthz`` in process:
    41 µs of CPU a request through them, 23 µs without). A
    ``RecsError`` is answered as the app's exception handler answers it (``_error``); any other
    exception goes up to Starlette's server-error middleware (500), as before. Everything else
    (``/docs``, ``/openapi.json``, 404, 405) goes down the usual stack."""

    def __init__(self, app, routes: list[APIRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            for route in self.routes:
                match, child_scope = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child_scope)
                    try:
                        response = await route.endpoint(Request(scope, receive, send))
                    except RecsError as error:
                        response = _error(error)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


_ENCODER = msgspec.json.Encoder()  # ~4 µs for a 20-item list; the standard library takes ~50


def _json(document: Any, status_code: int = 200) -> Response:
    return Response(
        content=_ENCODER.encode(document), status_code=status_code, media_type="application/json"
    )


def _error(error: RecsError) -> Response:
    status = getattr(error, "http_status", 500)
    response = _json({"detail": str(error)}, status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="recs"'
    return response


def create_app(
    settings: Settings | None = None,
    *,
    store: LiveStore | None = None,
    versions: VersionCache | None = None,
    clock: read_path.Clock | None = None,
    watch: bool = True,
) -> FastAPI:
    """The FastAPI application (also the uvicorn factory ``recs.serving.api:create_app``).

    Defaults: ``settings`` from the environment, the live store at
    ``settings.live_store_url`` (``api_store_connections`` pooled connections), a
    ``VersionCache`` over ``settings.published_dir`` whose served pointer is shared with the
    other workers when ``api_state_dir`` is set (loaded at startup, then watched every
    ``api_reload_interval_seconds`` when ``watch``), and the wall clock. Tests inject a fixed
    ``clock``, a ``store`` or ``versions``. Raises ``ConfigurationError`` if
    ``RECS_API_JWT_SECRET`` is unset.
    """
    settings = settings or get_settings()
    tokens = VerifiedTokens(secret_of(settings))
    own_store = store is None
    if store is None:
        local = settings.live_store_url.startswith("sqlite:///")
        store = LiveStore(
            settings.live_store_url,
            timeout_ms=settings.api_store_timeout_ms,
            pool_size=settings.api_store_connections + (1 if local else 0),
        )
    own_versions = versions is None
    if versions is None:
        pointer = None
        if settings.api_state_dir is not None:
            pointer = SharedPointer(
                settings.api_state_dir,
                straggler_seconds=settings.api_version_switch_timeout_seconds,
            )
        versions = VersionCache(
            settings.published_dir,
            interval_seconds=settings.api_reload_interval_seconds,
            cold_start_pool=settings.api_cold_start_pool,
            pointer=pointer,
        )
    clock = clock or read_path.wall_clock
    # The store's own timeouts answer first; this bounds a store that does not answer at all.
    deadline = 2 * settings.api_store_timeout_ms / 1000 or None
    store_threads = anyio.CapacityLimiter(settings.api_store_connections)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await anyio.to_thread.run_sync(versions.refresh)
        if versions.active is None:
            log.warning("no published version loaded yet: /readyz answers 503 until one is")
        if watch:
            versions.start()
        try:
            yield
        finally:
            versions.stop()
            if own_versions:
                versions.pointer.close()
            if own_store:
                store.close()
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(os.getpid())

    app = FastAPIOffline(
        title="recs read API",
        version="1",
        summary="Who to follow: the nightly batch list, validated against the live graph at "
        "read time, with a cold-start fallback. Bearer JWT auth (`recs token USER_ID`).",
        lifespan=lifespan,
    )
    app.router.route_class = _PlainRoute  # every route below: request in, response out
    app.state.settings = settings
    app.state.store = store
    app.state.versions = versions

    async def recs_error(_request: Request, error: Exception) -> Response:
        return _error(error)

    app.add_exception_handler(RecsError, recs_error)

    async def in_store_thread(operation: str, func, *args):
        """Run a store-bound function in the store thread pool, answering 503 if it does not
        finish within ``deadline`` (the thread is left to finish; its connection is then
        returned)."""
        try:
            with anyio.fail_after(deadline):
                return await anyio.to_thread.run_sync(
                    func, *args, limiter=store_threads, abandon_on_cancel=True
                )
        except TimeoutError:
            STORE_ERRORS.labels(operation).inc()
            raise StoreUnavailableError(
                f"live store unavailable ({operation}): no answer within {deadline * 1000:.0f} ms"
            ) from None

    def read_list(user_id: int, limit: int) -> dict[str, Any]:
        version = versions.active  # resolved once: the whole response is one version
        with store.session():
            return read_path.who_to_follow(
                user_id, limit, version=version, store=store, settings=settings, now=clock()
            )

    # Path and query values are read from the request, not declared as parameters: FastAPI's
    # per-request parameter machinery cost ~150 µs here, more than the whole read path. The
    # OpenAPI schema still documents them (``openapi_extra``).
    @app.get(
        WHO_TO_FOLLOW_PATH,
        response_model=None,
        openapi_extra={"parameters": [_USER_ID_PARAM, _limit_param(settings)]},
        responses={
            200: {"description": "The list (see recs.serving.read_path.who_to_follow)."},
            400: {"description": "Malformed user id or limit."},
            401: {"description": "Missing, invalid or expired bearer token."},
            403: {"description": "The token is for another user."},
            404: {"description": "Unknown or inactive user."},
            503: {"description": "Live store unavailable: dismissals/blocks cannot be checked."},
        },
    )
    async def who_to_follow(request: Request) -> Response:
        """One user's who-to-follow list: the batch list validated against the live store, or
        the cold-start list."""
        principal = tokens.principal(request.headers.get("authorization"))
        user_id = parse_id(request.path_params["user_id"], "user id")
        check_read(principal, user_id)
        limit = read_path.parse_limit(_one_query_value(request, "limit"), settings)
        if store.is_local:
            document = read_list(user_id, limit)
        else:
            document = await in_store_thread("read", read_list, user_id, limit)
        request.state.source = document["source"]
        return _json(document)

    @app.post(
        "/v1/users/{user_id}/dismissals",
        status_code=201,
        response_model=None,
        openapi_extra={
            "parameters": [_USER_ID_PARAM],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["candidate_id"],
                            "properties": {"candidate_id": {"type": "integer", "minimum": 0}},
                        }
                    }
                },
            },
        },
    )
    async def add_dismissal(request: Request) -> Response:
        """Body ``{"candidate_id": N}``. 201 once committed (200 if already dismissed)."""
        principal = tokens.principal(request.headers.get("authorization"))
        user_id = parse_id(request.path_params["user_id"], "user id")
        check_write(principal, user_id)
        candidate = _candidate_from_body(await request.body())
        document = await in_store_thread(
            "add_dismissal", read_path.record_dismissal, store, user_id, candidate, clock()
        )
        return _json(document, 201 if document["created"] else 200)

    @app.delete(
        "/v1/users/{user_id}/dismissals/{candidate_id}",
        status_code=204,
        response_model=None,
        openapi_extra={"parameters": [_USER_ID_PARAM, _CANDIDATE_ID_PARAM]},
    )
    async def delete_dismissal(request: Request) -> Response:
        """Undo a dismissal: 204, or 404 if there was none."""
        principal = tokens.principal(request.headers.get("authorization"))
        user_id = parse_id(request.path_params["user_id"], "user id")
        check_write(principal, user_id)
        candidate = parse_id(request.path_params["candidate_id"], "candidate id")
        await in_store_thread(
            "remove_dismissal", read_path.remove_dismissal, store, user_id, candidate, clock()
        )
        return Response(status_code=204)

    @app.get("/healthz", response_model=None)
    async def healthz(_request: Request) -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz", response_model=None)
    async def readyz(_request: Request) -> Response:
        version = versions.active
        if version is None:
            return _json({"status": "not ready", "detail": "no published version loaded"}, 503)
        return _json(
            {
                "status": "ready",
                "run_id": version.run_id,
                "snapshot_date": version.snapshot_date,
                "generated_at": (utc_iso(version.generated_at) if version.generated_at else None),
            }
        )

    @app.get(
        "/metrics",
        response_model=None,
        responses={
            200: {"description": "Prometheus text exposition."},
            401: {"description": "Missing, invalid or expired bearer token."},
            403: {"description": "Not a service token."},
        },
    )
    async def metrics(request: Request) -> Response:
        """Prometheus metrics: a service-role token is required unless api_metrics_public."""
        if not settings.api_metrics_public:
            check_service(tokens.principal(request.headers.get("authorization")), "/metrics")
        return Response(generate_latest(_registry()), media_type=CONTENT_TYPE_LATEST)

    # Innermost first: the direct dispatch sits right above Starlette's exception middleware.
    app.add_middleware(
        _DirectRoutes, routes=[r for r in app.router.routes if isinstance(r, _PlainRoute)]
    )
    app.add_middleware(
        _BodyLimit,
        max_bytes=settings.api_max_body_bytes,
        timeout_seconds=settings.api_body_timeout_seconds,
    )
    app.add_middleware(_RequestMetrics)  # added last: outermost, so it times and counts 413s
    return app


_USER_ID_PARAM = {
    "name": "user_id",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 0},
}
_CANDIDATE_ID_PARAM = {**_USER_ID_PARAM, "name": "candidate_id"}


def _one_query_value(request: Request, name: str) -> str | None:
    """The query parameter ``name`` given at most once (None if not given): ``?limit=2&limit=50``
    is 400, not the last value silently. Raises ``InvalidRequestError``."""
    values = request.query_params.getlist(name)
    if len(values) > 1:
        raise InvalidRequestError(f"{name} given {len(values)} times: give it once")
    return values[0] if values else None


def _limit_param(settings: Settings) -> dict:
    return {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {
            "type": "integer",
            "minimum": 1,
            "maximum": settings.api_max_limit,
            "default": settings.api_default_limit,
        },
    }


class _Literal(str):
    """A number of the body's JSON kept as its text (``-0``), so it is refused as it was sent."""


def _json_int(literal: str) -> int | str:
    """``parse_int`` of the body's JSON: the integer, except ``-0`` (not canonical) which stays
    the literal text (``_Literal``), so it is refused as a non-integer."""
    return _Literal(literal) if literal == "-0" else int(literal)


def _as_sent(value: object) -> str:
    """A value of the body as the client's JSON spelled it (``true``, ``"21"``, ``-0``): a
    newcomer read Python's ``True`` in an API's message. ASCII, other characters escaped: a
    lone surrogate (``"\\ud800"``) could not be encoded in the answer (a review's 500), and a
    control or bidirectional character is not echoed raw."""
    return str(value) if isinstance(value, _Literal) else json.dumps(value)


def _candidate_from_body(body: bytes) -> int:
    """``candidate_id`` of ``{"candidate_id": N}``: a JSON integer in ``0 .. 2**63 - 1``
    (``true``, ``21.0``, ``"21"``, ``-0`` are refused). ``InvalidRequestError`` otherwise."""
    try:
        document = json.loads(body or b"null", parse_int=_json_int)
    except (ValueError, RecursionError):  # RecursionError: absurdly nested arrays/objects
        raise InvalidRequestError(
            'invalid request body: expected JSON like {"candidate_id": 123}'
        ) from None
    if not isinstance(document, dict) or "candidate_id" not in document:
        raise InvalidRequestError('invalid request body: expected JSON like {"candidate_id": 123}')
    value = document["candidate_id"]
    if type(value) is not int or not 0 <= value <= MAX_USER_ID:
        raise InvalidRequestError(
            f"invalid candidate id {quoted(value, render=_as_sent)}: expected a JSON integer "
            "from 0 to 2**63 - 1, not a string, fraction or boolean"
        )
    return value


def _registry():
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY
