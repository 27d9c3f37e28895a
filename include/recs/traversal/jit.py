"""The traversal's compile decorators: Numba ``njit``, cached on the sources it compiles in.

``compiled`` is ``njit(cache=True, nogil=True)``; ``stage`` is ``njit(inline="always")``, for
the small stage functions the kernel composes (inlined into it at compile time, so the flow
costs no calls). Numba keys its on-disk cache on the source of the decorated function's own
file only, so a kernel whose stages live in other modules would reload stale machine code after
one of them changed. ``compiled`` therefore adds to that key a digest of every module of
``recs.traversal`` and of ``recs.sampling`` (whose ``sample_key`` the first-hop sampler compiles
in): a change to any of them recompiles the traversal once, on its next call.

Relies on Numba's cache internals (``Dispatcher._cache._cache_file._source_stamp``, numba
0.61-0.68); where they are absent (caching unavailable) the function compiles uncached.
``compile_timer`` measures what a call spent compiling (or loading from that cache), through
Numba's event API (``numba.core.event``, the ``numba:compile`` event), so a shard's kernel rate
leaves it out.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from numba import njit
from numba.core import event

from recs import sampling

_SOURCES = (*sorted(Path(__file__).parent.glob("*.py")), Path(sampling.__file__))


@functools.cache
def sources_digest() -> str:
    """SHA-256 over the names and bytes of the sources the traversal compiles in."""
    digest = hashlib.sha256()
    for path in _SOURCES:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def compiled(function):
    """``njit(cache=True, nogil=True)`` whose cache entry is stale once any traversal source
    changes (see the module docstring)."""
    dispatcher = njit(cache=True, nogil=True)(function)
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if cache_file is not None and hasattr(cache_file, "_source_stamp"):
        cache_file._source_stamp = (cache_file._source_stamp, sources_digest())
    return dispatcher


def stage(function):
    """A stage of the compiled flow: inlined into its caller (``inline="always"``); callable
    from Python too (then compiled on its own, uncached: tests only)."""
    return njit(inline="always", nogil=True)(function)


@contextmanager
def compile_timer() -> Iterator[list[float]]:
    """Seconds the block spent compiling or loading compiled code from Numba's cache, in the
    one-element list it yields, set when the block ends: the outermost ``numba:compile``
    events' spans (a kernel's callees compile inside its own event), 0.0 when all of it was
    compiled already in this process."""
    seconds = [0.0]
    with event.install_recorder("numba:compile") as recorder:
        yield seconds
    depth, started = 0, 0.0
    for stamp, happened in recorder.buffer:
        if happened.is_start:
            depth += 1
            started = stamp if depth == 1 else started
        else:
            depth -= 1
            seconds[0] += stamp - started if depth == 0 else 0.0
