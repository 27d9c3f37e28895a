"""The GX plumbing's import: ``quiet_gx`` imports GX with the cyclic garbage collector paused
(``recs.collector``) and gives it back as it found it, also when the import fails; the
modules it defers (``GX_DEFERRED_MODULES``) load on first use."""

from __future__ import annotations

import gc
import math
import subprocess
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


def test_scipy_stats_is_loaded_on_first_use():
    """In a fresh process, ``quiet_gx`` leaves ``scipy.stats`` unloaded (a stand-in) and
    GX's own reference to it works on first use: KL divergence of (1/2, 1/2) from (1/4, 3/4)
    is 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3)."""
    code = (
        "import sys\n"
        "from recs.nightly.checkpoints import quiet_gx\n"
        "quiet_gx()\n"
        "before = type(sys.modules['scipy.stats']).__name__\n"
        "from great_expectations.expectations.core import "
        "expect_column_kl_divergence_to_be_less_than as kl\n"
        "value = kl.stats.entropy([0.5, 0.5], [0.25, 0.75])\n"
        "print(before, type(sys.modules['scipy.stats']).__name__, repr(float(value)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)  # fmt: skip
    before, after, value = done.stdout.split()
    assert (before, after) == ("Deferred", "module")
    assert float(value) == pytest.approx(0.5 * math.log(4 / 3), rel=1e-12)
