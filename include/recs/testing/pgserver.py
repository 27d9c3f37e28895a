"""A throwaway local PostgreSQL server (``initdb`` + ``pg_ctl``) for tests and benchmarks.

The tests and ``make bench-ingest`` run the live store on a real PostgreSQL, not a mock: this
module starts a private cluster in a temporary folder on a free localhost port, with ``trust``
authentication for the ``postgres`` role, and removes it on ``stop()``. It uses the server
binaries of Debian's ``postgresql`` package (``/usr/lib/postgresql/<version>/bin``, the newest
version found) or ``RECS_PG_BINDIR``. PostgreSQL refuses to run as root, so as root the
cluster is owned by and run as the ``postgres`` user the Debian package creates (``runuser``).

Server settings: ``synchronous_commit = off`` (a commit returns before its WAL is flushed,
the durability SQLite's ``synchronous = NORMAL`` in WAL mode also gives; at most
``wal_writer_delay`` x 3 of commits can be lost on a crash, never corrupted) and, with
``durable=False`` (tests), ``fsync = off`` and ``full_page_writes = off``. Never point this at a
server you care about: it is for disposable data only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recs.errors import RecsError

SUPERUSER = "postgres"


class PostgresUnavailableError(RecsError):
    """No PostgreSQL server binaries, or the throwaway server did not start."""


def find_bindir() -> Path | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, or None.

    ``RECS_PG_BINDIR`` if set, else the newest ``/usr/lib/postgresql/<version>/bin`` (Debian),
    else the folder of ``pg_ctl`` on ``PATH``.
    """
    candidates: list[Path] = []
    if os.environ.get("RECS_PG_BINDIR"):
        candidates.append(Path(os.environ["RECS_PG_BINDIR"]))
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = [p for p in debian.iterdir() if p.name.replace(".", "").isdigit()]
        for version in sorted(versions, key=lambda p: float(p.name), reverse=True):
            candidates.append(version / "bin")
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for folder in candidates:
        if all((folder / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class LocalPostgres:
    """A running throwaway cluster; ``url`` is a SQLAlchemy/libpq URL of its ``postgres``
    database."""

    root: Path
    port: int
    bindir: Path
    run_as: str | None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def url_for(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def create_database(self, name: str) -> str:
        """Create an empty database (``template0``) and return its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url_for(name)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its folder."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _run(
                [str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"],
                self.run_as,
                timeout=60,
            )
        shutil.rmtree(self.root, ignore_errors=True)


def _run(
    command: list[str],
    run_as: str | None,
    timeout: float,
    *,
    cpu_idle: bool = False,
    cpus: set[int] | None = None,
) -> subprocess.CompletedProcess:
    if run_as:
        command = ["runuser", "-u", run_as, "--", *command]

    def confine() -> None:  # in the child, before exec: inherited by everything it starts
        if cpus:
            os.sched_setaffinity(0, cpus)
        if cpu_idle:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
        preexec_fn=confine if cpu_idle or cpus else None,  # noqa: PLW1509 - no threads touched before exec
    )


def _bindir() -> Path:
    bindir = find_bindir()
    if bindir is None:
        raise PostgresUnavailableError(
            "no PostgreSQL server binaries found: install Debian's postgresql package "
            "(`make test` does) or set RECS_PG_BINDIR"
        )
    return bindir


def _new_server(bindir: Path) -> LocalPostgres:
    run_as = SUPERUSER if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="recs-postgres-"))
    if run_as:
        shutil.chown(root, user=run_as)
    return LocalPostgres(root=root, port=_free_port(), bindir=bindir, run_as=run_as)


def start(*, durable: bool = True, settings: dict[str, str] | None = None) -> LocalPostgres:
    """``initdb`` a cluster in a new temporary folder and start it on a free localhost port.

    ``durable=False`` turns off ``fsync`` and ``full_page_writes`` (tests). ``settings`` are
    extra ``-c name=value`` server settings. Raises ``PostgresUnavailableError`` when no server
    binaries are installed or the server fails to start (with the end of its log).
    """
    server = _new_server(_bindir())
    options = {
        "synchronous_commit": "off",
        **({} if durable else {"fsync": "off", "full_page_writes": "off"}),
        **(settings or {}),
    }

    def create() -> None:
        _run(
            [
                str(server.bindir / "initdb"),
                "-D",
                str(server.data_dir),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            server.run_as,
            timeout=120,
        )

    return _launch(server, create, options)


def start_standby(
    primary: LocalPostgres,
    *,
    cpu_idle: bool = False,
    cpus: set[int] | None = None,
    settings: dict[str, str] | None = None,
) -> LocalPostgres:
    """A streaming-replication hot standby of ``primary``, on its own free port.

    ``pg_basebackup --write-recovery-conf`` copies the primary (``trust`` authentication lets
    the ``postgres`` role replicate from 127.0.0.1, initdb's default ``pg_hba.conf``), then the
    copy starts in recovery and replays the primary's WAL as it streams (asynchronously: the
    primary never waits for it). It serves read-only queries, ``REPEATABLE READ`` included,
    which is how ``freeze_snapshot`` reads it (``Settings.snapshot_store_url``). Set up as a
    dedicated snapshot standby: ``hot_standby_feedback = on`` (the primary keeps the row
    versions a running read still needs, so vacuum on the primary cancels no snapshot) and
    ``max_standby_streaming_delay = -1`` (replay of a lock a read conflicts with, e.g. vacuum
    truncating emptied pages, waits for the read instead of cancelling it after 30 s; the
    standby lags meanwhile, the primary does not notice).

    ``cpu_idle=True`` starts the server under the ``SCHED_IDLE`` CPU policy and ``cpus`` confines
    it to those CPUs (both inherited by every backend it forks): on a benchmark box the two
    together stand in for a standby on another host (``bench/ingest.py`` says why both are
    needed). Raises ``PostgresUnavailableError`` as ``start``.
    """
    server = _new_server(primary.bindir)
    options = {
        "hot_standby": "on",
        "hot_standby_feedback": "on",
        "max_standby_streaming_delay": "-1",
        **(settings or {}),
    }

    def copy() -> None:
        _run(
            [
                str(server.bindir / "pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                SUPERUSER,
                "-D",
                str(server.data_dir),
                "--write-recovery-conf",
                "--wal-method=stream",
                "--checkpoint=fast",
                "--no-sync",
            ],
            server.run_as,
            timeout=600,
        )

    return _launch(server, copy, options, cpu_idle=cpu_idle, cpus=cpus)


def _launch(
    server: LocalPostgres,
    create: Callable[[], None],
    settings: dict[str, str],
    *,
    cpu_idle: bool = False,
    cpus: set[int] | None = None,
) -> LocalPostgres:
    """Create the data folder with ``create``, start the server with ``settings``, wait."""
    options = {
        "listen_addresses": "127.0.0.1",
        "port": str(server.port),
        "unix_socket_directories": str(server.root),
        **settings,
    }
    try:
        create()
        flags = " ".join(f"-c {name}={value}" for name, value in options.items())
        command = [
            str(server.bindir / "pg_ctl"),
            "-D",
            str(server.data_dir),
            "-o",
            flags,
            "-l",
            str(server.root / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        ]
        _run(command, server.run_as, timeout=90, cpu_idle=cpu_idle, cpus=cpus)
    except (subprocess.SubprocessError, OSError) as error:
        log_file = server.root / "server.log"
        tail = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
        detail = getattr(error, "stderr", "") or str(error)
        server.stop()
        raise PostgresUnavailableError(
            f"the throwaway PostgreSQL server did not start: {detail.strip()} {tail.strip()}"
        ) from None
    _wait_until_ready(server)
    return server


def _wait_until_ready(server: LocalPostgres, timeout: float = 30.0) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(server.url, connect_timeout=5):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
