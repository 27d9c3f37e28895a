"""Fixtures of the read-path tests (``api_fixtures`` describes the hand-built world)."""

from api_fixtures import client, world  # noqa: F401 - pytest fixtures
