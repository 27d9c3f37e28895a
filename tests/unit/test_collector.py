"""``recs.collector.paused``: the collector is off inside the block and given back as found,
also when the block raises and when pauses nest."""

from __future__ import annotations

import gc

import pytest

from recs import collector

pytestmark = pytest.mark.usefixtures("collector_state")  # each test leaves it as found


def test_off_inside_on_after():
    gc.enable()
    with collector.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_pauses_restore_on_the_outer_exit_only():
    gc.enable()
    with collector.paused():
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause found it off: it leaves it off
    assert gc.isenabled()


def test_a_caller_that_keeps_it_off_finds_it_off():
    gc.disable()
    with collector.paused():
        pass
    assert not gc.isenabled()


def test_a_raising_block_gives_it_back():
    gc.enable()
    with pytest.raises(RuntimeError, match="the block failed"), collector.paused():
        raise RuntimeError("the block failed")
    assert gc.isenabled()
