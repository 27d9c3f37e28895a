"""Modules imported on first use: a stand-in in ``sys.modules`` until an attribute is read.

A library may import, at its own import, a heavy module that only code we never call uses
(Great Expectations, and ``scipy.stats`` or ``altair``; why, and what it saves:
``recs.nightly.checkpoints.GX_DEFERRED_MODULES``). ``defer(name)`` puts a ``Deferred``
stand-in under ``name``: an ``import`` of it binds the stand-in at once, and the first
attribute read imports the real module through the import system (its module locks, its
clean-up of a failed import) and answers from it. Any later read is forwarded.

Not ``importlib.util.LazyLoader``, the documented recipe: on Python < 3.11.9 its first access
is not locked (two threads: one gets a half-run module, CPython gh-114763), and a failure or
an interrupt during that access (which an ``import`` statement triggers by reading
``__spec__``) is swallowed and leaves the half-run module in ``sys.modules`` for good. Here the
stand-in leaves ``sys.modules`` before the real import, so a failed one raises as usual and
the next read tries again.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from typing import Any

_LOADING = threading.RLock()  # re-entered if the module reads the stand-in as it loads


class Deferred(types.ModuleType):
    """Stands in for module ``name`` (whose spec it carries, so ``find_spec`` still answers)
    until an attribute is read; then imports it once (``importlib.import_module``, under a
    lock shared by every stand-in) and returns the real module's attribute."""

    def __init__(self, name: str, spec: Any) -> None:
        super().__init__(name)
        self.__spec__ = spec

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._load(), attribute)

    def _load(self) -> types.ModuleType:
        name = self.__name__
        parent, _, child = name.rpartition(".")
        with _LOADING:
            # the real import must find neither the stand-in nor, while it runs, its package's
            # reference to it (scipy.stats' own modules read ``scipy.stats`` as they load)
            if sys.modules.get(name) is self:
                del sys.modules[name]
            if parent and getattr(sys.modules.get(parent), child, None) is self:
                delattr(sys.modules[parent], child)
            return importlib.import_module(name)  # raises as usual; a retry comes here again


def defer(name: str) -> bool:
    """Put a ``Deferred`` stand-in for ``name`` in ``sys.modules`` (and on its parent package,
    as a finished import leaves it). Returns False, doing nothing, if ``name`` is imported
    already or is not installed. Importing the parent package is not deferred
    (``find_spec`` imports it: ``scipy``, 7 ms)."""
    if name in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # no parent package
        return False
    if spec is None:
        return False
    stand_in = Deferred(name, spec)
    sys.modules[name] = stand_in
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, stand_in)
    return True
