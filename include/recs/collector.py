"""Python's cyclic garbage collector, paused around work that allocates much and leaves little
cyclic garbage: importing a large library, dbt's parse and build, batches of ingested events.

Each collection walks every tracked object of its generation, so while a step creates
hundreds of thousands of objects and frees almost none of them in cycles, the collections it
triggers are pure cost. ``paused()`` turns the collector off for the block and gives it back
as it found it (a caller that runs with it off, such as an ingest worker, keeps it off).
Measured where it is used: ``bench/README.md`` ("The night at scale") and ``recs.ingest.run``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """Disable the cyclic collector for the block; re-enable it afterwards (also when the
    block raises) if it was enabled before. Reference counting still frees everything that is
    not in a cycle; cycles made meanwhile wait for the next collection."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
