"""Whether this machine's ``published/`` is the one the read API serves: the run store records
which version ``CURRENT`` names (``RunStore.current``), and a machine whose own ``CURRENT``
names another (or none) must not compare with it, move it or prune behind it.

Used by the gate (``baseline``), publishing and rollbacks (``publish``) and ``recs gc``
(``retention``); without a run store every machine may act (its ``published/`` is the only one).
"""

from __future__ import annotations

from pathlib import Path

from recs.errors import RecsError, RunStoreError
from recs.nightly import artifacts, switch
from recs.nightly.artifacts import RunStore


def unseen_current(
    published_dir: Path,
    here: str | None,
    store: RunStore | None = None,
    *,
    finishing: str | None = None,
) -> str | None:
    """Why this machine must not act on ``published_dir`` (``here``: the version its
    ``CURRENT`` names, None if none), or None if it may: the run store (``store``, default the
    process's) records that ``CURRENT`` names another version, so this is not the
    ``published/`` the API serves, or a stale copy of it. None without a run store, when it
    records nothing yet (a deployment that has just set one) or when it records ``here``.
    Callers act on it their own way: the gate compares with ``CURRENT`` (``baseline``),
    publishing and rollbacks move it (``publish``), ``recs gc`` keeps the runs behind it
    (``retention``).

    ``finishing``: the version a command is about to make current (or, for the gate, the run
    it validates). When the store records it and this machine began that very switch from
    ``here`` and was cut off (killed) between the store's write and its own ``CURRENT``'s
    (``switch.began_here``), running the command again may finish it. A stale copy, or a
    switch that failed and set the store back, stays refused."""
    store = store if store is not None else artifacts.run_store()
    recorded = store.current() if store is not None else None
    if recorded is None or recorded == here:
        return None
    if recorded == finishing and switch.began_here(published_dir, here, finishing):
        return None
    seen = f"names {here}" if here else "has no CURRENT"
    return f"the run store records CURRENT = {recorded} while {published_dir} here {seen}"


def refuse_unseen(
    published_dir: Path,
    here: str | None,
    command: str,
    error: type[RecsError] = RunStoreError,
    *,
    finishing: str | None = None,
) -> None:
    """Raise ``error`` (one line: ``run <command> where published/ is: ...``) when this
    machine's ``published/`` is not the served one (``unseen_current``; ``finishing``: the
    version the command makes current, as there). When this machine's ``CURRENT`` names a
    version published here, the line ends with the remedy for a store whose record is wrong (a
    store folder mistyped, then corrected: from a newcomer, who did not find it in the README),
    ``recs rollback --to <here>`` run here (``publish.rollback``), and why it is not for a
    stale copy: there it would misdirect the served machine (a review's)."""
    unseen = unseen_current(published_dir, here, finishing=finishing)
    if unseen is None:
        return
    remedy = ""
    if here and (Path(published_dir) / here).is_dir():
        remedy = (
            f"; only if this is the served published/ and the store's record is the wrong one "
            f"(its RECS_RUN_STORE_URL was changed), `recs rollback --to {here}` here records "
            f"{here} (on a stale copy it would misdirect the served machine)"
        )
    raise error(f"run {command} where published/ is: {unseen}{remedy}")
