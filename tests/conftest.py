"""Fixtures shared by every test folder: the live store on SQLite and on a real PostgreSQL.

``store_url`` is parametrized over both backends, so a test that takes it runs twice: against a
SQLite file in its ``tmp_path`` and against a fresh database on a throwaway PostgreSQL server
(``recs.testing.pgserver``: ``initdb`` + ``pg_ctl`` of Debian's ``postgresql`` package, started once
per session, on the first test that needs it). ``RECS_TEST_POSTGRES_URL`` points the tests at an
existing server instead (e.g. the docker-compose one); its databases are created and left there.
Without server binaries the PostgreSQL cases are skipped, unless ``RECS_REQUIRE_POSTGRES=1``
(``make test`` sets it), which makes that a failure.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator

import pytest

from tests.needs import need

BACKENDS = ("sqlite", "postgresql")
_databases = itertools.count()


class _ExternalServer:
    def __init__(self, url: str) -> None:
        self.url = url

    def create_database(self, name: str) -> str:
        import psycopg
        from sqlalchemy.engine import make_url

        from recs.store.connections import libpq_url

        with psycopg.connect(libpq_url(self.url), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return make_url(self.url).set(database=name).render_as_string(hide_password=False)

    def stop(self) -> None:
        pass


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[object]:
    """A PostgreSQL server for the session: ``.create_database(name) -> url``."""
    external = os.environ.get("RECS_TEST_POSTGRES_URL")
    if external:
        yield _ExternalServer(external)
        return
    from recs.testing import pgserver

    need(
        pgserver.find_bindir(),
        "no PostgreSQL server binaries (make test installs Debian's postgresql package; "
        "or set RECS_PG_BINDIR / RECS_TEST_POSTGRES_URL)",
        "RECS_REQUIRE_POSTGRES",
    )
    server = pgserver.start(durable=False)
    try:
        yield server
    finally:
        server.stop()


def _new_database(server) -> str:
    return server.create_database(f"recs_test_{next(_databases)}_{uuid.uuid4().hex[:8]}")


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """The URL of a new empty database on the session's PostgreSQL server."""
    return _new_database(postgres_server)


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path) -> str:
    """The URL of an empty live store: a SQLite file, or a new database on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'live.db'}"
    return _new_database(request.getfixturevalue("postgres_server"))


@pytest.fixture
def collector_state() -> Iterator[None]:
    """Give the cyclic garbage collector back as the test found it (on or off), whatever the
    test turns it to (``recs.collector``)."""
    import gc

    was_enabled = gc.isenabled()
    yield
    if was_enabled:
        gc.enable()
    else:
        gc.disable()
