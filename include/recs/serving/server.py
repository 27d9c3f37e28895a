"""Running the read API under uvicorn with the limits a production server has (``recs serve``).

Limits, each a setting (``recs.config``), on uvicorn's own options where it has them:

- ``api_max_connections`` → uvicorn ``limit_concurrency``: beyond it, new requests get 503.
- ``api_keepalive_timeout_seconds`` → uvicorn ``timeout_keep_alive``: idle keep-alive closed.
- ``api_max_header_bytes``: request line plus headers. httptools has no such limit (and joins a
  long header value chunk by chunk, quadratic in its length), so ``LimitedHttpToolsProtocol``
  counts the bytes received before the headers end: beyond it, 431 and the connection closed.
- ``api_header_timeout_seconds``: from a connection's opening, or a request's first byte, to the
  end of its headers (slow-header clients): then 408 and closed.
- ``api_body_timeout_seconds``: each body chunk, enforced by ``serving.api`` (408).

With ``--workers N > 1`` each worker is a process (uvicorn's supervisor restarts one that
dies); they share the Prometheus multiprocess folder and the served-version state folder
(``coordination``), both made fresh here unless set, and removed on exit.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from recs.config import Settings, get_settings
from recs.errors import ConfigurationError
from recs.serving.auth import secret_of
from recs.serving.metrics import HTTP_REFUSED

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


@dataclass(frozen=True)
class HttpLimits:
    """The protocol-level limits (bytes, seconds)."""

    max_header_bytes: int
    header_timeout_seconds: float

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpLimits:
        return cls(settings.api_max_header_bytes, settings.api_header_timeout_seconds)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header size limit and a header read timeout.

    The limits come from ``config.recs_http_limits`` (an ``HttpLimits``) if set, else from the
    settings of the environment. Refusals are counted in ``recs_api_http_refused_total``."""

    def __init__(self, config, server_state, app_state, _loop=None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = getattr(config, "recs_http_limits", None) or _default_limits()
        self._max_header_bytes = limits.max_header_bytes
        self._header_timeout = limits.header_timeout_seconds
        self._awaiting_headers = False
        self._header_bytes = 0
        self._header_timer = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_headers()

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._awaiting_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        if (
            self._awaiting_headers
            and self._header_bytes > self._max_header_bytes
            and not self.transport.is_closing()
        ):
            self._refuse(431, "header", f"request headers over {self._max_header_bytes:,} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._await_headers()

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._cancel_header_timer()
        # The whole request may have come in one chunk: measure what was parsed.
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self._max_header_bytes:
            self._refuse(431, "header", f"request headers over {self._max_header_bytes:,} bytes")
            return
        super().on_headers_complete()

    def _await_headers(self) -> None:
        if not self._awaiting_headers:
            self._awaiting_headers = True
            self._header_bytes = 0
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self._header_timeout, self._headers_late)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self._awaiting_headers and not self.transport.is_closing():
            self._refuse(
                408, "header_timeout", f"request headers not received in {self._header_timeout} s"
            )

    def _refuse(self, status: int, limit: str, detail: str) -> None:
        """Answer ``status`` (when no response is in progress) and close the connection."""
        HTTP_REFUSED.labels(limit).inc()
        self._awaiting_headers = False
        self._cancel_header_timer()
        if self.cycle is None or self.cycle.response_complete:
            body = json.dumps({"detail": detail}).encode()
            self.transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%s" % (status, _REASONS[status], len(body), body)
            )
        self.transport.close()


_LIMITS: HttpLimits | None = None


def _default_limits() -> HttpLimits:
    global _LIMITS
    if _LIMITS is None:
        _LIMITS = HttpLimits.from_settings(get_settings())
    return _LIMITS


def uvicorn_options(settings: Settings) -> dict:
    """The uvicorn options that carry the settings' limits (also used by the tests' servers)."""
    return {
        "http": LimitedHttpToolsProtocol,
        "limit_concurrency": settings.api_max_connections,
        "timeout_keep_alive": settings.api_keepalive_timeout_seconds,
    }


def log_config() -> dict:
    """uvicorn's logging configuration plus ours: the ``recs`` loggers at INFO on stderr, each
    line with the logger's name and the worker's pid. uvicorn applies it in every worker
    process, so one worker and several log the same lines (a worker started by ``--workers 2``
    had no handler but Python's last resort, which drops INFO), and a version switch is an
    INFO line ("serving published version B (was A)"), not a WARNING that alerting would raise
    every night (a newcomer's finding)."""
    import uvicorn.config

    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["formatters"]["recs"] = {  # the worker's pid: which of several switched, or failed
        "()": "uvicorn.logging.DefaultFormatter",
        "fmt": "%(levelprefix)s %(name)s [%(process)d] %(message)s",
    }
    config["handlers"]["recs"] = {**config["handlers"]["default"], "formatter": "recs"}
    config["loggers"]["recs"] = {"handlers": ["recs"], "level": "INFO", "propagate": False}
    return config


BIND_HINTS = {
    errno.EADDRINUSE: "another process holds the port? choose another with --port or RECS_API_PORT",
    errno.EADDRNOTAVAIL: "not an address of this machine: give one of its own with --host or "
    "RECS_API_HOST, or {every} for every interface",
    errno.EACCES: "a port below net.ipv4.ip_unprivileged_port_start ({first}) needs "
    "privileges: choose another with --port or RECS_API_PORT",
}
"""What to do about a bind that fails, by its errno (any other: its own message alone)."""
POLICY_HINT = (
    "not a privileged port here (net.ipv4.ip_unprivileged_port_start is {first}): a security "
    "policy of this machine refused it (SELinux, AppArmor, a container's seccomp profile?)"
)
"""EACCES on a port at or above the first unprivileged one (the privileges are not why)."""
UNPRIVILEGED_PORT_START = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")


def _first_unprivileged_port() -> int:
    """Linux's ``net.ipv4.ip_unprivileged_port_start`` (1024 where it cannot be read)."""
    try:
        return int(UNPRIVILEGED_PORT_START.read_text().strip())
    except (OSError, ValueError):
        return 1024


def bind_hint(error_number: int | None, port: int, host: str) -> str:
    """What to do about a bind of ``host:port`` that failed with ``error_number``: its
    ``BIND_HINTS`` entry, or for EACCES on a port no privilege guards, ``POLICY_HINT``
    ("" for an errno without one)."""
    first = _first_unprivileged_port()
    if error_number == errno.EACCES and port >= first:
        return POLICY_HINT.format(first=first)
    return BIND_HINTS.get(error_number or 0, "").format(
        every="::" if ":" in host else "0.0.0.0", first=first
    )


def check_port(host: str, port: int, workers: int = 1) -> None:
    """Raise ``ConfigurationError`` (one line, exit 2) if ``host:port`` cannot be bound now, as
    uvicorn binds it (``SO_REUSEADDR``): another process holds the port, or the host is not
    this machine's. Before it, uvicorn's own start-up failure was a raw log line and exit 3,
    which the CLI's exit table uses for a failed gate."""
    if not host:
        return  # every interface: uvicorn binds each family it can, more than one probe shows
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ConfigurationError(f"cannot serve on {where}: {error.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and workers == 1:
            # as uvicorn binds it: one process through asyncio, IPv6 only (beside an IPv4
            # holder); several through its own socket, dual-stack, as the probe is by default
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            probe.bind(address)
        except OSError as error:
            hint = bind_hint(error.errno, port, host)
            message = f"cannot serve on {where}: {error.strerror}" + (f" ({hint})" if hint else "")
            raise ConfigurationError(message) from None


def serve(settings: Settings, *, host: str, port: int, workers: int, access_log: bool) -> None:
    """Run the API under uvicorn until interrupted (``recs serve``).

    Checks the secret first (``ConfigurationError``). With ``workers > 1``: fresh folders for
    the Prometheus multiprocess mode and the served-version state, unless
    ``PROMETHEUS_MULTIPROC_DIR`` / ``RECS_API_STATE_DIR`` are set (removed on exit)."""
    import uvicorn

    secret_of(settings)
    made: list[str] = []
    if workers > 1:
        for variable, prefix in (
            ("PROMETHEUS_MULTIPROC_DIR", "recs-metrics-"),
            ("RECS_API_STATE_DIR", "recs-serving-"),
        ):
            if not os.environ.get(variable):
                os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
                made.append(os.environ[variable])
    try:
        uvicorn.run(
            "recs.serving.api:create_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            loop="uvloop",
            access_log=access_log,
            log_level="info" if access_log else "warning",
            log_config=log_config(),
            timeout_graceful_shutdown=10,
            **uvicorn_options(settings),
        )
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
