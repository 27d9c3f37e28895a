"""Switching ``CURRENT``: the publish-history event first, then the run store's record, then
the file, and what a failure at each step leaves and says.

``record_event`` appends the event (``recs.nightly.history``: why first); a failed append is a
``SwitchError`` saying nothing was switched. ``write_current`` records the switch in the run
store (``artifacts.RunStore.set_current``), then replaces ``published/CURRENT`` atomically and
durably; a write that fails sets the store's record back where it did not move, and says
whether it moved (``SwitchError``). Callers hold the publisher lock (``publish.publisher_lock``):
``publish_run``, ``set_current`` and ``rollback``. With a run store, ``SWITCHING_FILE`` marks
a switch in progress: a kill between the store's record and the file leaves it, and the same
command run again finishes the switch (``began_here``, ``served``). ``interrupted_switch``
warns of a switch a Ctrl-C cut short.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recs import files
from recs.errors import RecsError, SwitchError
from recs.files import atomic_write
from recs.nightly import history
from recs.nightly.artifacts import RunStore, run_store
from recs.published import CURRENT_FILE, current_version

log = logging.getLogger("recs.nightly.switch")

SWITCHING_FILE = ".switching"
"""``published/.switching``: ``{"from": what CURRENT named, "to": run_id}`` while this machine
switches ``CURRENT`` with a run store (hidden: no run id starts with a dot)."""
ATTEMPTS: list[str] = []
"""The run ids this process began to write into ``CURRENT``, in order (``interrupted_switch``
tells its own switch from another process's by it)."""


def record_event(
    published_dir: Path, action: str, run_id: str, previous: str | None, **fields: Any
) -> None:
    """``history.record`` (``fields``: its keyword arguments), its ``OSError`` (a full disk) a
    ``SwitchError`` saying that nothing was switched: the event is appended before ``CURRENT``
    is touched."""
    try:
        history.record(published_dir, action, run_id, previous, **fields)
    except OSError as error:
        raise SwitchError(
            f"could not record the {action} of {run_id} in {history.HISTORY_FILE}: {error}; "
            f"CURRENT still names {previous or 'nothing'} (nothing was switched), so run the "
            "command again once the history can be written"
        ) from error


def write_current(published_dir: Path, run_id: str) -> None:
    """Replace ``CURRENT`` atomically and durably: readers see the old name or the new one.
    With a run store, the switch is recorded there first (``artifacts.RunStore.set_current``)
    and a store that fails leaves ``CURRENT`` as it was (``RunStoreError``): the record is never
    behind the switch, so a gate on a machine that does not see ``published/`` errors instead of
    comparing with nothing (``baseline``).

    A write that fails (an ``OSError``, or Ctrl-C) before ``CURRENT`` moved sets the store's
    record back to the one it replaced (``_set_back``), so running the command again is not
    refused as from a stale copy (``served``). An ``OSError`` raises ``SwitchError`` saying
    whether ``CURRENT`` names ``run_id`` now (``_switch_failed``): the failure can come after
    the rename (the folder's fsync), and then a plain rollback run again would go one version
    further back. Ctrl-C is raised as it came; the command's ``interrupted_switch`` says
    whether ``CURRENT`` moved.

    With a run store, ``SWITCHING_FILE`` says from the start of the switch to its end which
    switch this machine is making; a kill between the store's record and ``CURRENT``'s write
    leaves it, and the same command run again may then finish the switch (``began_here``)."""
    store = run_store()
    before = store.current() if store is not None else None
    already = _named(published_dir) == run_id  # published again: nothing is switched
    ATTEMPTS.append(run_id)
    try:
        if store is not None:  # in the try: Ctrl-C once the store has it is set back too
            _switch_began(published_dir, run_id)
            store.set_current(run_id)
        with atomic_write(published_dir / CURRENT_FILE, sync_folder=True) as handle:
            handle.write(f"{run_id}\n")
    except BaseException as error:  # an OSError, or Ctrl-C: is the store's record right?
        named = _named(published_dir)
        moved = None if named is _UNREADABLE else named == run_id  # None: the record stays
        set_back = _set_back(store, run_id, before) if store and moved is False else None
        if moved is not None and set_back is None:  # the store agrees with CURRENT again
            _switch_ended(published_dir)
        if isinstance(error, OSError) and already:  # a republish: nothing was to move
            raise SwitchError(
                f"could not write CURRENT, which names {run_id} already (nothing was switched): "
                f"{error}; run the command again once it can be written"
            ) from error
        if isinstance(error, OSError):
            raise SwitchError(_switch_failed(published_dir, run_id, error, set_back)) from error
        raise
    _switch_ended(published_dir)


def _switch_began(published_dir: Path, run_id: str) -> None:
    """Write ``SWITCHING_FILE``, durably (the store's record it precedes is): ``from`` is the
    name ``CURRENT`` holds as the commands compare it with the store's (None for none, an empty,
    damaged or unreadable one: ``current_version(strict=False, require_folder=False)``)."""
    here = current_version(published_dir, strict=False, require_folder=False)
    with files.atomic_write(published_dir / SWITCHING_FILE, sync_folder=True) as handle:
        json.dump({"from": here, "to": run_id}, handle, sort_keys=True)


def _switch_ended(published_dir: Path) -> None:
    """Remove ``SWITCHING_FILE``; a failure only logs (the switch's outcome stands, and a file
    left names a switch whose retry is then allowed to end it again)."""
    try:
        (published_dir / SWITCHING_FILE).unlink(missing_ok=True)
    except OSError as error:
        log.warning("could not remove %s: %s", published_dir / SWITCHING_FILE, error)


def began_here(published_dir: Path, here: str | None, target: str | None) -> bool:
    """Whether this machine began a switch of ``CURRENT`` from ``here`` to ``target`` and was
    cut off before its end (``SWITCHING_FILE`` left by a kill). A switch that failed and set
    the store back, or ended, or was given up (``record_in_run_store``) removed the file; a
    stale copy of ``published/`` has none, unless it was copied in the middle of a switch."""
    try:
        document = json.loads((published_dir / SWITCHING_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and (document.get("from"), document.get("to")) == (
        here, target)  # fmt: skip


@contextlib.contextmanager
def interrupted_switch(published_dir: Path) -> Iterator[None]:
    """Around a command that may switch ``CURRENT`` (``recs publish``, ``rollback``, ``run``):
    Ctrl-C passes on (the command says only "aborted", exit 130), after a warning if this
    process's own switch moved ``CURRENT`` (``ATTEMPTS``; another process's switch meanwhile is
    not warned of), whenever the interrupt came: during the folder's sync after the rename, or
    once ``write_current`` had returned. A plain rollback run again would then go one version
    further back. (Reviews found both windows, and the other process's switch.)"""
    before, attempted = _named(published_dir), len(ATTEMPTS)
    try:
        yield
    except KeyboardInterrupt:
        after = _named(published_dir)
        mine = ATTEMPTS[attempted:]  # another process's switch meanwhile is not this one's
        if mine and after != before and (after is _UNREADABLE or after == mine[-1]):
            log.warning(
                "interrupted once CURRENT was switched: CURRENT %s (it named %s when the "
                "command began); check it with `recs runs` before running anything again (a "
                "plain `recs rollback` again would go one version further back)",
                "cannot be read back" if after is _UNREADABLE else f"names {after} now",
                "nothing" if before is None else "what cannot be read"
                if before is _UNREADABLE else before,
            )  # fmt: skip
        raise


_UNREADABLE = object()


def _named(published_dir: Path) -> str | None | object:
    """What ``CURRENT`` names, read as it is (None: no file, a first switch; ``_UNREADABLE``:
    a file that cannot be read or decoded)."""
    try:
        return (published_dir / CURRENT_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return _UNREADABLE


def _set_back(store: RunStore, run_id: str, before: str | None) -> str | None:
    """Put the run store's record of ``CURRENT`` back to ``before`` (``""``: none) after a
    switch to ``run_id`` that did not happen here, unless it no longer records ``run_id``
    (another machine switched since: its record stands). Returns why it could not, or None."""
    try:
        if store.current() == run_id:
            store.set_current(before or "")
    except RecsError as error:
        return str(error)
    return None


def _switch_failed(published_dir: Path, run_id: str, error: OSError, set_back: str | None) -> str:
    """What an operator must know of a failed switch to ``run_id``: whether it happened, read
    back strictly (an unreadable ``CURRENT`` is not "nothing"), and whether the run store's
    record could not be set back (``set_back``: why)."""
    what = f"could not make CURRENT name {run_id}: {error}"
    try:
        now = current_version(published_dir)
    except RecsError as unreadable:
        return (
            f"{what}; CURRENT cannot be read back ({unreadable}): check it with `recs runs` "
            "before running anything again"
        )
    if now == run_id:
        return (
            f"{what}; CURRENT names {run_id} now, but the switch may not survive a crash: "
            "check it with `recs runs` before running anything again (a plain `recs rollback` "
            "again would go one version further back)"
        )
    if set_back is not None:
        mend = f"`recs rollback --to {now}` here records it" if now else "correct its record"
        return (
            f"{what}; CURRENT still names {now or 'nothing'}, but the run store records "
            f"{run_id} and could not be set back ({set_back}): {mend}, then run the command "
            "again"
        )
    return f"{what}; CURRENT still names {now or 'nothing'}, so run the command again"


def record_in_run_store(published_dir: Path, run_id: str) -> None:
    """Record in the run store, if one is set, that ``CURRENT`` names ``run_id``: the store and
    ``CURRENT`` agree, so a switch this machine left unfinished is given up (``SWITCHING_FILE``
    removed: a retry of it would otherwise pass where this machine is no longer served)."""
    store = run_store()
    if store is not None:
        store.set_current(run_id)
        _switch_ended(published_dir)
