"""Test support, loaded only by servers that tests start (``servers.served``): shortens anyio's
worker-thread idle timeout, so a test's idle gaps outlast it in seconds, not minutes."""

import os

_seconds = os.environ.get("RECS_TEST_ANYIO_IDLE_SECONDS")
if _seconds:
    from anyio._backends import _asyncio

    _asyncio.WorkerThread.MAX_IDLE_TIME = float(_seconds)
