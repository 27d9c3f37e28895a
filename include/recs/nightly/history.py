"""The publish history: every change of ``CURRENT``, in order, and the rollback target.

``published/.history.jsonl`` holds one JSON object a line, appended and fsynced under the
publisher lock by ``publish_run``, ``set_current`` and ``rollback`` (``recs.nightly.publish``):
``{"seq", "at", "action": "publish" | "rollback" | "set_current", "run_id", "previous",
"current"}``, and a publish's ``snapshot_date`` (the version's; absent in events written
before it was recorded); ``previous`` is what ``CURRENT`` named before, ``current`` whether
it names ``run_id`` after (a backfill of an older date is published without becoming
current); ``at`` is the UTC time, for people reading it: nothing computes with it. A version
is never a part of it, so a version's bytes stay independent of when it was published.

An event is appended *before* ``CURRENT`` is switched. A switch that then fails (a full disk,
a killed process) leaves an event for a change that did not happen, and its retry appends
another; the other order lost, when the append failed, what the switch had replaced: the retry
recorded the version replacing itself, and the next rollback went to the wrong version (a
review's finding). An append cut off mid-line is ended before the next one is written.

``predecessor(run_id)`` is the version that was current when ``run_id`` was last published and
made current: the version before it in publish order, except that a version that was rolled
back from is not chosen again by the next publish's rollback. It is the default target of
``recs rollback`` and one of the versions ``recs gc`` never removes. Without a history (versions
published before it existed) the order of snapshot dates stands in for the publish order.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from recs.files import fsync_dir
from recs.published import list_versions

HISTORY_FILE = ".history.jsonl"  # hidden: no run id starts with a dot


def events(published_dir: Path) -> list[dict[str, Any]]:
    """Every recorded change, oldest first (unreadable lines, bytes that are not UTF-8 among
    them, are skipped; no file: ``[]``). Raises ``OSError`` (a folder in its place)."""
    return _parsed(_text(Path(published_dir) / HISTORY_FILE) or "")


def _text(path: Path) -> str | None:
    try:  # a byte that is not UTF-8 spoils its line only (a review's: a traceback before)
        return path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None


def _parsed(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line torn by a crash mid-append: the ones before it still count
        if isinstance(event, dict) and isinstance(event.get("run_id"), str):
            found.append(event)
    return found


def record(
    published_dir: Path,
    action: str,
    run_id: str,
    previous: str | None,
    *,
    current: bool,
    snapshot_date: str | None = None,
) -> dict[str, Any]:
    """Append one event (call under the publisher lock) and fsync it; return it.
    ``snapshot_date`` is recorded when given (a publish's)."""
    path = Path(published_dir) / HISTORY_FILE
    text = _text(path)
    torn = bool(text) and not text.endswith("\n")  # an append cut off mid-line: end it first
    event = {
        "seq": len(_parsed(text or "")) + 1,
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "action": action,
        "run_id": run_id,
        "previous": previous,
        "current": current,
        **({"snapshot_date": snapshot_date} if snapshot_date is not None else {}),
    }
    with path.open("a", encoding="utf-8") as handle:
        handle.write(("\n" if torn else "") + json.dumps(event, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    if text is None:
        fsync_dir(path.parent)
    return event


def predecessor(published_dir: Path, run_id: str) -> str | None:
    """The version before ``run_id`` (module docstring), or None if there is none."""
    recorded = [e for e in events(published_dir) if e.get("action") == "publish"]
    for event in reversed(recorded):
        if event["run_id"] != run_id or not event.get("current"):
            continue
        if event.get("previous") == run_id:
            continue  # a republish of the same run: look further back
        return event.get("previous")
    names = [v["run_id"] for v in list_versions(published_dir)]
    if run_id not in names:
        return None
    position = names.index(run_id)
    return names[position - 1] if position else None


def failed_switches(found: list[dict[str, Any]], current: str | None) -> list[bool]:
    """For each event of ``found`` (``events``, oldest first), whether it records a switch of
    ``CURRENT`` that did not happen: it was to make ``run_id`` current, and ``CURRENT`` still
    named the event's ``previous`` afterwards (the next event's ``previous``, or ``current``,
    what ``CURRENT`` names now, after the last). An event is appended before its switch, so a
    switch that failed and was never retried leaves one (module docstring). Only a version
    named after it is evidence: ``CURRENT`` naming nothing afterwards (none, or damaged and
    mended by a named rollback) says nothing, so a first switch that failed is not marked."""
    after = [event.get("previous") for event in found[1:]] + [current] if found else []
    return [
        bool(event.get("current"))
        and event.get("previous") != event["run_id"]
        and named is not None
        and named == event.get("previous")
        for event, named in zip(found, after, strict=True)
    ]


def recency(published_dir: Path) -> list[str]:
    """Version names, least recently used first: by the last event naming each, after the
    versions the history never names (those by snapshot date, then run id). A switch that
    failed (``failed_switches``) counts as a use: its version is kept like a recent one, for
    the retry."""
    last: dict[str, int] = {}
    for index, event in enumerate(events(published_dir)):
        last[event["run_id"]] = index
    names = [v["run_id"] for v in list_versions(published_dir)]
    unnamed = [name for name in names if name not in last]
    named = sorted((name for name in names if name in last), key=lambda name: last[name])
    return unnamed + named
