"""The GX plumbing's import: ``quiet_gx`` pauses the cyclic garbage collector for GX's import
only, and gives it back as it found it, also when the import fails."""

from __future__ import annotations

import gc
import sys

import pytest

from recs.nightly.checkpoints import quiet_gx


@pytest.fixture
def collector():
    """Restore the collector's state whatever a test leaves."""
    was_enabled = gc.isenabled()
    yield
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


def test_an_enabled_collector_is_enabled_again(collector):
    gc.enable()
    quiet_gx()
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled(collector):
    """An ingest worker runs with the collector off (recs.ingest.worker): quiet_gx must not
    turn it on."""
    gc.disable()
    quiet_gx()
    assert not gc.isenabled()


def test_a_failed_import_gives_the_collector_back(collector, monkeypatch):
    """GX missing (``sys.modules`` entry None makes the import raise ImportError): the error
    propagates and the collector runs again."""
    monkeypatch.setitem(sys.modules, "great_expectations", None)
    gc.enable()
    with pytest.raises(ImportError):
        quiet_gx()
    assert gc.isenabled()
