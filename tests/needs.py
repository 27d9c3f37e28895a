"""What a test needs from the machine: skipped without it, failed instead under ``make test``.

``make test`` installs PostgreSQL, Redis and Chromium and sets ``RECS_REQUIRE_POSTGRES``,
``RECS_REQUIRE_REDIS`` and ``RECS_REQUIRE_BROWSER`` to 1, so there a missing one is a failure,
never a silently skipped test; a developer's ``pytest`` without them skips those tests."""

from __future__ import annotations

import os
from typing import TypeVar

import pytest

T = TypeVar("T")


def need(found: T | None, message: str, flag: str) -> T:
    """``found`` (a binary's path, a bindir), or skip with ``message``; fail if ``$flag`` is 1."""
    if found is None:
        if os.environ.get(flag) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found
