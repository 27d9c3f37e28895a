"""The GX plumbing's import: ``quiet_gx`` imports GX with the cyclic garbage collector paused
(``recs.collector``) and gives it back as it found it, also when the import fails."""

from __future__ import annotations

import gc
import sys
from contextlib import contextmanager

import pytest

from recs.nightly import checkpoints
from recs.nightly.checkpoints import quiet_gx


def test_the_import_runs_paused(collector_state, monkeypatch):
    """GX is imported inside ``collector.paused()``: a spy in its place sees the collector
    running on entry (it is the one that pauses it) and GX imported on exit."""
    seen = []
    real = checkpoints.collector.paused

    @contextmanager
    def spy():
        seen.append(("enter", gc.isenabled()))
        with real():
            yield
        seen.append(("exit", "great_expectations" in sys.modules))

    monkeypatch.setattr(checkpoints.collector, "paused", spy)
    gc.enable()
    quiet_gx()
    assert seen == [("enter", True), ("exit", True)]
    assert gc.isenabled()


def test_a_failed_import_gives_the_collector_back(collector_state, monkeypatch):
    """GX missing (``sys.modules`` entry None makes the import raise ImportError): the error
    propagates and the collector runs again."""
    monkeypatch.setitem(sys.modules, "great_expectations", None)
    gc.enable()
    with pytest.raises(ImportError):
        quiet_gx()
    assert gc.isenabled()
