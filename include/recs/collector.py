"""Python's cyclic garbage collector, paused around work that allocates much and leaves little
cyclic garbage: importing a large library, dbt's parse and build, batches of ingested events.

Each collection walks every tracked object of its generation while holding the GIL, so while a
step creates hundreds of thousands of objects and frees few of them in cycles, the collections
it triggers are mostly cost. ``paused()`` turns the collector off for the block and gives it
back as it found it. The switch is the process's: a pause stops collections in every thread,
and two threads pausing at once may restore it early, so it is for single-threaded callers
(a task process, a CLI command), never shared by threads. Measured where it is used:
``bench/README.md`` ("The night at scale") and ``recs.ingest.run``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """Disable the cyclic collector for the block; re-enable it afterwards (also when the
    block raises) if it was enabled before, so nested pauses and a caller that keeps it off
    are left as they were. Reference counting still frees everything that is not in a cycle;
    cycles made meanwhile wait for the next collection."""
    collecting = gc.isenabled()
    try:
        gc.disable()
        yield
    finally:
        if collecting:
            gc.enable()
