"""``recs.deferred``: a module imported on first use. A throwaway package under ``tmp_path``
counts how often its module ran (``LOADS``) and can fail its import on demand (``FAIL``)."""

from __future__ import annotations

import sys
import threading

import pytest

from recs import deferred

HEAVY = """\
import time
import deferpkg
if deferpkg.FAIL:
    deferpkg.FAIL -= 1
    raise KeyboardInterrupt("interrupted while loading")
time.sleep(deferpkg.SLEEP)
deferpkg.LOADS.append(1)
VALUE = 42
"""


@pytest.fixture
def package(tmp_path, monkeypatch):
    """``deferpkg`` (``LOADS``, ``FAIL``, ``SLEEP``) with the module ``deferpkg.heavy``;
    both imported modules are removed afterwards."""
    folder = tmp_path / "deferpkg"
    folder.mkdir()
    (folder / "__init__.py").write_text("LOADS = []\nFAIL = 0\nSLEEP = 0.0\n")
    (folder / "heavy.py").write_text(HEAVY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import deferpkg

    yield deferpkg
    for name in ("deferpkg.heavy", "deferpkg"):
        sys.modules.pop(name, None)


def test_an_import_binds_the_stand_in_and_the_first_read_runs_the_module(package):
    assert deferred.defer("deferpkg.heavy")
    import deferpkg.heavy as bound
    from deferpkg import heavy

    assert heavy is bound and isinstance(bound, deferred.Deferred)
    assert package.LOADS == []  # nothing ran yet
    assert bound.VALUE == 42 and package.LOADS == [1]
    real = sys.modules["deferpkg.heavy"]
    assert not isinstance(real, deferred.Deferred) and package.heavy is real
    from deferpkg.heavy import VALUE

    assert VALUE == 42 and bound.VALUE == 42 and package.LOADS == [1]  # forwarded, ran once
    assert not deferred.defer("deferpkg.heavy")  # imported already: left alone


def test_a_failed_first_load_raises_and_the_next_read_tries_again(package):
    """An interrupt while the module runs reaches the reader (not swallowed, as
    ``LazyLoader`` does on an ``import`` statement) and leaves no half-run module behind."""
    package.FAIL = 1
    deferred.defer("deferpkg.heavy")
    import deferpkg.heavy as bound

    with pytest.raises(KeyboardInterrupt, match="interrupted while loading"):
        _ = bound.VALUE
    assert "deferpkg.heavy" not in sys.modules and package.LOADS == []
    from deferpkg.heavy import VALUE

    assert VALUE == 42 and bound.VALUE == 42 and package.LOADS == [1]


def test_threads_reading_it_at_once_run_it_once(package):
    """Eight threads released together read an attribute of the stand-in while the module
    takes 0.2 s to run: every one gets the value, and the module ran once."""
    package.SLEEP = 0.2
    deferred.defer("deferpkg.heavy")
    import deferpkg.heavy as bound

    start = threading.Barrier(8)
    values: list[object] = []

    def read() -> None:
        start.wait()
        try:
            values.append(bound.VALUE)
        except BaseException as error:  # noqa: BLE001 - recorded for the assertion
            values.append(error)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert values == [42] * 8 and package.LOADS == [1]


def test_missing_modules_are_not_deferred():
    assert not deferred.defer("recs_no_such_module")
    assert not deferred.defer("recs_no_such_package.stats")
    assert "recs_no_such_module" not in sys.modules
    assert "recs_no_such_package.stats" not in sys.modules
