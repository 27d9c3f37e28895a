"""Group commit of one process's dismissal writes: writes that wait for a commit share the next
transaction, so its lock wait and fsync are paid once for all of them.

Contract: ``GroupCommit(commit).run(Write(operation, body))`` returns ``body``'s result or raises
its error once the transaction holding it has committed (or failed); ``commit(writes)`` runs one
transaction over ``writes`` and sets each one's ``result`` or ``error`` (``LiveStore._commit``).
Measured effect and reasoning: ``serving/README.md``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_UNSET = object()


class Write:
    """One write waiting for its transaction (``live_store.LiveStore._write``)."""

    __slots__ = ("operation", "body", "result", "error", "wake", "lead")

    def __init__(self, operation: str, body: Callable[[Any], Any]) -> None:
        self.operation = operation
        self.body = body
        self.result: Any = _UNSET
        self.error: BaseException | None = None
        self.wake = threading.Event()
        self.lead = False

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class GroupCommit:
    """Group commit of one process's writes (the way databases batch commits).

    The first write to find no transaction of this process in progress leads: it commits
    every write waiting at that moment, in arrival order, in one transaction
    (``LiveStore._commit``), then passes the lead to the first write that arrived meanwhile and
    wakes the writes it committed. So a write waits at most for the transaction in progress
    and its own, however many arrive together, instead of one commit (an fsync) per write
    queued before it; the transaction's lock and fsync are shared. Every wait is bounded by
    the store's own timeouts (the leader's lock wait, its statements)."""

    def __init__(self, commit: Callable[[list[Write]], None]) -> None:
        self._commit = commit
        self._lock = threading.Lock()
        self._waiting: list[Write] = []
        self._busy = False

    def run(self, write: Write) -> Any:
        with self._lock:
            self._waiting.append(write)
            write.lead = not self._busy
            self._busy = True
        if not write.lead:
            write.wake.wait()  # set by the leader: committed, or this write leads now
            if not write.lead:
                return write.outcome()
        with self._lock:
            batch, self._waiting = self._waiting, []
        try:
            self._commit(batch)
        except BaseException as error:
            for each in batch:  # the leader failed unexpectedly: so did the transaction
                if each.result is _UNSET and each.error is None:
                    each.error = error
            raise
        finally:
            with self._lock:
                if self._waiting:
                    self._waiting[0].lead = True
                    self._waiting[0].wake.set()
                else:
                    self._busy = False
            for other in batch:
                if other is not write:
                    other.wake.set()
        return write.outcome()
