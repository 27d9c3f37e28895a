"""Fixtures of the read-path tests (``api_fixtures`` describes the hand-built world).

The hand-derived expectations of the batch path are of the batch list alone: every test here
runs with ``RECS_FILL_SHORT_LISTS=false`` (also seen by the servers the tests start), except
``test_fill.py``, which tests the top-up from cold start itself.
"""

import pytest
from api_fixtures import client, world  # noqa: F401 - pytest fixtures


@pytest.fixture(autouse=True)
def _batch_lists_unfilled(request, monkeypatch):
    if request.module.__name__ != "test_fill":
        monkeypatch.setenv("RECS_FILL_SHORT_LISTS", "false")
