"""The ``recs`` fixture of the CLI tests: the real entry point, output captured."""

from __future__ import annotations

import pytest

from recs import cli
from recs.config import get_settings

SECRET = "test-secret-0123456789-abcdefghijklmnop"


@pytest.fixture
def recs(tmp_path, monkeypatch, capsys):
    """``recs(*args) -> (exit code, stdout, stderr lines)`` with RECS_HOME in tmp_path."""
    monkeypatch.setenv("RECS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RECS_API_JWT_SECRET", SECRET)
    monkeypatch.delenv("RECS_STORE_URL", raising=False)
    (tmp_path / "home").mkdir()
    get_settings.cache_clear()

    def run(*args: str):
        code = cli.main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err.splitlines()

    yield run
    get_settings.cache_clear()
