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


def _after_quiet_gx(lines: str) -> list[str]:
    """What ``lines`` print (split into words), run in a fresh process after ``quiet_gx()``,
    ``before`` (the type names of ``scipy.stats`` and ``altair`` then), ``altair_submodules``
    (the names of those loaded by then) and the import of GX's KL divergence expectation module
    as ``kl`` (a module that imports both deferred modules)."""
    code = (
        "import sys\n"
        "from recs.nightly.checkpoints import quiet_gx\n"
        "quiet_gx()\n"
        "before = {n: type(sys.modules.get(n)).__name__ for n in ('scipy.stats', 'altair')}\n"
        "altair_submodules = [n for n in sys.modules if n.startswith('altair.')]\n"
        "from great_expectations.expectations.core import "
        "expect_column_kl_divergence_to_be_less_than as kl\n"
        f"{lines}\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)  # fmt: skip
    return done.stdout.split()


def test_scipy_stats_is_loaded_on_first_use():
    """In a fresh process, ``quiet_gx`` leaves ``scipy.stats`` unloaded (a stand-in) and
    GX's own reference to it works on first use: KL divergence of (1/2, 1/2) from (1/4, 3/4)
    is 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3)."""
    before, after, value = _after_quiet_gx(
        "value = kl.stats.entropy([0.5, 0.5], [0.25, 0.75])\n"
        "print(before['scipy.stats'], type(sys.modules['scipy.stats']).__name__, "
        "repr(float(value)))"
    )
    assert (before, after) == ("Deferred", "module")
    assert float(value) == pytest.approx(0.5 * math.log(4 / 3), rel=1e-12)


def test_altair_is_loaded_on_first_use():
    """In a fresh process, ``quiet_gx`` leaves ``altair`` unloaded (a stand-in, and none of its
    submodules); GX's own reference to it (the KL divergence's ``alt``) loads it on first use,
    and a submodule import then works: a chart made through GX's reference has the one mark
    it was given."""
    assert _after_quiet_gx(
        "chart = kl.alt.Chart().mark_bar()\n"
        "import altair.vegalite\n"
        "print(before['altair'], len(altair_submodules), type(sys.modules['altair']).__name__, "
        "chart.mark)"
    ) == ["Deferred", "0", "module", "bar"]


def test_saved_results_are_the_stores_text_and_render_in_the_data_docs(tmp_path, caplog):
    """A shard's ``gx_results`` hold the text GX's store keeps (parsed here: the suite, its
    two expectations, one failed on the row with a null), and ``validate_run``'s call renders
    them into its Data Docs beside its own: a page for the shard's batch and one for the run's.
    A saved result whose text cannot be read is logged and left out, the others still render.
    """
    import json

    import great_expectations.expectations as gxe
    import polars as pl

    from recs.nightly.checkpoints import GateBatch, run_checkpoints
    from recs.nightly.runs import RunPaths

    paths = RunPaths.create(tmp_path / "home", "2026-11-01", "test_run")
    rows = GateBatch("rows", pl.DataFrame({"user_id": [1, 2, None]}), keys=["user_id"])
    rows.expect("no_null_user", gxe.ExpectColumnValuesToNotBeNull, column="user_id")
    rows.expect("user_positive", gxe.ExpectColumnValuesToBeBetween, column="user_id",
                min_value=1)  # fmt: skip
    shard = run_checkpoints([rows], paths, label="shard_000", data_docs=False)
    [saved] = shard["gx_results"]
    document = json.loads(saved["value"])
    assert document["suite_name"] == "recs_rows" and document["success"] is False
    assert [r["success"] for r in document["results"]] == [False, True]

    run = GateBatch("run", pl.DataFrame({"rows": [3]}), keys=[])
    run.expect("rows_positive", gxe.ExpectColumnValuesToBeBetween, column="rows", min_value=1)
    damaged = {"key": [*saved["key"][:-1], "damaged"], "value": "{not json"}
    with caplog.at_level("WARNING", logger="recs.nightly.checkpoints"):
        result = run_checkpoints([run], paths, saved_results=[saved, damaged])
    validations = paths.validation_dir / "data_docs" / "validations"
    pages = sorted(p.relative_to(validations).parts[0] for p in validations.rglob("*.html"))
    assert result["data_docs"] is not None and pages == ["recs_rows", "recs_run"]
    assert "a saved GX result could not be restored" in caplog.text
