"""Published versions in memory, and the one the service answers from, swapped without a restart.

``PublishedVersion`` decodes each shard file of a version (``recs.published`` layout) once into
Arrow-backed NumPy columns sorted by ``(user_id, rank)`` -- no Python object per row -- and finds
a user's rows with two binary searches (O(log n)), converting only those <= top_k rows.

``VersionCache`` holds the loaded versions of this process. Its watcher thread looks at
``CURRENT`` (and the named version's manifest inode, so a rerun that replaced a version's folder
is seen) every ``api_reload_interval_seconds``; a new version is loaded and checked *in the
background*, announced to the served pointer (``coordination``), and served once every worker
holds it. A request reads ``active`` once and uses only that object, so every response comes
from exactly one version; in-flight requests finish on the old one, which stays valid (it is in
memory; its files may go). A version that fails to load is logged and counted, and the old one
keeps serving. Several replicas at a larger scale: ``serving/README.md``.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from recs.config import Settings
from recs.contracts import GLOBAL_TAG
from recs.errors import CorruptFileError, StoreUnavailableError
from recs.published import MANIFEST_FILE, check_version, current_version, shard_file
from recs.serving.coordination import Key, LocalPointer, SharedPointer
from recs.serving.metrics import (
    VERSION_INFO,
    VERSION_LOAD_FAILURES,
    VERSION_LOAD_SECONDS,
    VERSION_SWAPS,
)
from recs.sharding import shard_of
from recs.store.connections import one_line

log = logging.getLogger("recs.serving")


class BatchRow(NamedTuple):
    """One published row of a user's list (``RECOMMENDATION_SCHEMA``), best first. (A named
    tuple: building 20 per request costs a third of a frozen dataclass.)"""

    candidate_id: int
    rank: int
    score: float
    mutual_count: int
    followed_by: tuple[int, ...]


class _ShardIndex:
    """One shard's rows as NumPy columns sorted by (user_id, rank); a user's rows are the
    slice between two binary searches."""

    __slots__ = (
        "user_ids",
        "candidate_ids",
        "mutual_counts",
        "scores",
        "ranks",
        "followed_offsets",
        "followed_values",
        "generated_at",
    )

    def __init__(self, path: Path) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        columns = ["user_id", "candidate_id", "mutual_count", "score", "rank", "followed_by"]
        table = pq.read_table(path, columns=[*columns, "generated_at"], memory_map=True)
        table = table.combine_chunks()
        user_ids = table.column("user_id").to_numpy()
        ranks = table.column("rank").to_numpy()
        if len(user_ids) > 1 and not _sorted_by_user_and_rank(user_ids, ranks):
            order = np.lexsort((table.column("candidate_id").to_numpy(), ranks, user_ids))
            table = table.take(pa.array(order)).combine_chunks()
            user_ids = table.column("user_id").to_numpy()
            ranks = table.column("rank").to_numpy()
        followed = table.column("followed_by").chunk(0) if table.num_rows else None
        if followed is not None and followed.null_count:
            followed = pc.if_else(pc.is_null(followed), pa.scalar([], followed.type), followed)
        self.user_ids = user_ids
        self.candidate_ids = table.column("candidate_id").to_numpy()
        self.mutual_counts = table.column("mutual_count").to_numpy()
        self.scores = table.column("score").to_numpy()
        self.ranks = ranks
        if followed is None:
            self.followed_offsets = np.zeros(1, dtype=np.int64)
            self.followed_values = np.zeros(0, dtype=np.int64)
        else:
            self.followed_offsets = followed.offsets.to_numpy()
            self.followed_values = followed.values.to_numpy()
        generated = table.column("generated_at").cast(pa.int64())
        self.generated_at = generated.to_numpy() if table.num_rows else np.zeros(0, np.int64)

    def rows(self, user_id: int) -> tuple[list[BatchRow], dt.datetime | None]:
        lo = int(self.user_ids.searchsorted(user_id, "left"))
        hi = int(self.user_ids.searchsorted(user_id, "right"))
        if lo == hi:
            return [], None
        offsets = self.followed_offsets[lo : hi + 1].tolist()
        values = self.followed_values[offsets[0] : offsets[-1]].tolist()
        base = offsets[0]
        rows = [
            BatchRow(candidate, rank, score, mutual, tuple(values[start - base : end - base]))
            for candidate, rank, score, mutual, start, end in zip(
                self.candidate_ids[lo:hi].tolist(),
                self.ranks[lo:hi].tolist(),
                self.scores[lo:hi].tolist(),
                self.mutual_counts[lo:hi].tolist(),
                offsets[:-1],
                offsets[1:],
                strict=True,
            )
        ]
        generated = _EPOCH + dt.timedelta(microseconds=int(self.generated_at[lo]))
        return rows, generated


_EPOCH = dt.datetime(1970, 1, 1)


def _sorted_by_user_and_rank(user_ids, ranks) -> bool:
    import numpy as np

    step = np.diff(user_ids)
    if (step < 0).any():
        return False
    same_user = step == 0
    return bool((np.diff(ranks)[same_user] >= 0).all())


class PublishedVersion:
    """One published version, loaded for reads (immutable once built).

    ``load`` checks the version is complete (``published.check_version``) and reads its
    manifest, popularity index and the top ``cold_start_pool`` recommendable accounts of
    ``candidate_profiles``; ``eager`` also indexes every shard now (the API: no first-request
    cost, and a swap happens only once everything is in memory), otherwise each shard is
    indexed on first use (the CLI reads one user).
    """

    def __init__(
        self, published_dir: Path, manifest: dict[str, Any], key: tuple, *, cold_start_pool: int
    ) -> None:
        self.published_dir = Path(published_dir)
        self.manifest = manifest
        self.key = key
        self.run_id: str = manifest["run_id"]
        self.snapshot_date: str | None = manifest.get("snapshot_date")
        self.shard_count = int(manifest["shard_count"])
        generated = manifest.get("generated_at")
        self.generated_at = dt.datetime.fromisoformat(generated) if generated else None
        self._shards: list[_ShardIndex | None] = [None] * self.shard_count
        self._shard_lock = threading.Lock()
        self._tag_lists: dict[str, tuple[list[int], list[int]]] = {}
        self._pool: list[int] = []
        self._merged: dict[tuple[str, ...], list[int]] = {}
        self._load_exports(cold_start_pool)

    @classmethod
    def load(
        cls, published_dir: Path, run_id: str, *, eager: bool = True, cold_start_pool: int = 10_000
    ) -> PublishedVersion:
        """Load version ``run_id``. Raises ``RunNotFoundError`` if it is missing or incomplete
        (and whatever pyarrow raises for a damaged file)."""
        published_dir = Path(published_dir)
        key = _version_key(published_dir, run_id)
        manifest = check_version(published_dir, run_id)
        version = cls(published_dir, manifest, key, cold_start_pool=cold_start_pool)
        if eager:
            for shard_id in range(version.shard_count):
                version._shard(shard_id)
        return version

    def _load_exports(self, cold_start_pool: int) -> None:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        root = self.published_dir / self.run_id
        names = {entry["path"] for entry in self.manifest.get("exports", [])}
        if "popularity_index.parquet" in names:
            table = pq.read_table(
                root / "popularity_index.parquet",
                columns=["tag", "candidate_id", "popularity_rank", "in_degree"],
            ).sort_by([("tag", "ascending"), ("popularity_rank", "ascending")])
            tags = table.column("tag").to_pylist()
            ids = table.column("candidate_id").to_pylist()
            degrees = table.column("in_degree").to_pylist()
            for tag, candidate, degree in zip(tags, ids, degrees, strict=True):
                listed = self._tag_lists.setdefault(tag, ([], []))
                listed[0].append(candidate)
                listed[1].append(degree)
        if "candidate_profiles.parquet" in names and cold_start_pool > 0:
            table = pq.read_table(
                root / "candidate_profiles.parquet",
                columns=["candidate_id", "in_degree", "is_recommendable"],
            )
            table = table.filter(pc.field("is_recommendable"))
            table = table.sort_by([("in_degree", "descending"), ("candidate_id", "ascending")])
            self._pool = table.column("candidate_id").slice(0, cold_start_pool).to_pylist()

    def _shard(self, shard_id: int) -> _ShardIndex:
        index = self._shards[shard_id]
        if index is None:
            with self._shard_lock:
                index = self._shards[shard_id]
                if index is None:
                    index = _ShardIndex(shard_file(self.published_dir, self.run_id, shard_id))
                    self._shards[shard_id] = index
        return index

    def batch_rows(self, user_id: int) -> tuple[list[BatchRow], dt.datetime | None]:
        """The user's published rows in rank order and their ``generated_at`` (naive UTC);
        ``([], None)`` if the user has none. O(log n) in the shard's row count."""
        return self._shard(shard_of(user_id, self.shard_count)).rows(user_id)

    def popular_for(self, tags: Iterable[str]) -> list[int]:
        """Cold-start order before the pool: the popularity lists of ``tags`` merged by
        in-degree (desc, then candidate_id asc, duplicates dropped), then the ``_global``
        list. Unknown tags contribute nothing. Cached per tag set."""
        key = tuple(sorted({t for t in tags if t != GLOBAL_TAG}))
        merged = self._merged.get(key)
        if merged is None:
            pairs = []
            for tag in key:
                ids, degrees = self._tag_lists.get(tag, ([], []))
                pairs.extend(zip(degrees, ids, strict=True))
            pairs.sort(key=lambda pair: (-pair[0], pair[1]))
            ordered = dict.fromkeys(candidate for _, candidate in pairs)
            ordered.update(dict.fromkeys(self._tag_lists.get(GLOBAL_TAG, ([], []))[0]))
            merged = list(ordered)
            self._merged[key] = merged
        return merged

    @property
    def pool(self) -> list[int]:
        """The most-followed recommendable accounts (``candidate_profiles``), best first."""
        return self._pool


def _version_key(published_dir: Path, run_id: str) -> tuple:
    """Identity of a version on disk: its run id and its manifest's inode and mtime, so a
    rerun that replaced the folder under the same run id counts as a new version."""
    try:
        info = os.stat(Path(published_dir) / run_id / MANIFEST_FILE)
    except OSError:
        return (run_id, None, None)
    return (run_id, info.st_ino, info.st_mtime_ns)


def load_current(settings: Settings, *, eager: bool = False) -> PublishedVersion | None:
    """The version ``CURRENT`` names, loaded (lazily by default: for one-off reads such as
    ``recs recommend``), or None if nothing is published. Raises ``RunNotFoundError`` if
    ``CURRENT`` names a missing or incomplete version."""
    run_id = current_version(settings.published_dir, require_folder=False)
    if run_id is None:
        return None
    return PublishedVersion.load(
        settings.published_dir, run_id, eager=eager, cold_start_pool=settings.api_cold_start_pool
    )


class VersionUnavailableError(StoreUnavailableError):
    """The server serves a version this worker cannot load (503)."""


class VersionCache:
    """The versions this process holds and the one it answers from (module docstring).

    ``active`` is read once per request: the version the served pointer names. ``refresh()``
    loads whatever ``CURRENT`` names (and the served version, for a worker that joins late) if
    it is not held yet, announces what this process holds and moves the pointer when every
    worker holds the new version; it returns True if the version this process answers from
    changed. The previous version stays loaded, so a rollback to it is instant. ``start()`` runs
    ``refresh`` every ``interval_seconds`` in a daemon thread; ``stop()`` ends it.
    ``pointer``: ``coordination.LocalPointer`` (default) or a ``SharedPointer``.
    """

    def __init__(
        self,
        published_dir: Path,
        *,
        interval_seconds: float = 0.5,
        cold_start_pool: int = 10_000,
        pointer: LocalPointer | SharedPointer | None = None,
    ) -> None:
        self.published_dir = Path(published_dir)
        self.interval_seconds = interval_seconds
        self.cold_start_pool = cold_start_pool
        self.pointer = pointer or LocalPointer()
        self._loaded: dict[Key, PublishedVersion] = {}
        self._announced: frozenset[Key] = frozenset()
        self._failed: set[Key] = set()
        self._serving: Key | None = None  # what the last refresh saw served (metrics, logs)
        self._previous: Key | None = None
        self._damaged: str | None = None  # the error of a CURRENT that names no version
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> PublishedVersion | None:
        """The version to answer this request from, or None while nothing is served. Raises
        ``VersionUnavailableError`` if the server serves one this worker cannot load."""
        key = self.pointer.served()
        if key is None:
            return None
        version = self._loaded.get(key)
        if version is None:
            version = self._catch_up(key)
        return version

    def refresh(self) -> bool:
        """One round of the watcher (class docstring). Never raises for a bad version: it is
        logged, counted and the old one kept."""
        with self._lock:
            served = self.pointer.served()
            if served is not None:
                self._hold(served)  # a worker that started after the server began serving
            try:
                run_id = current_version(self.published_dir, require_folder=False)
            except CorruptFileError as damaged:  # keep serving what is served; say so once
                if str(damaged) != self._damaged:
                    log.error("%s; serving the version already served", damaged)
                self._damaged, run_id = str(damaged), None
            else:
                self._damaged = None
            wanted = None
            if run_id is not None:
                key = _version_key(self.published_dir, run_id)
                if self._hold(key):
                    wanted = key
            self._announce()
            if wanted is not None:
                self.pointer.advance(wanted)
            now_served = self.pointer.served()
            changed = now_served != self._serving and now_served in self._loaded
            if changed:
                self._swapped(self._serving, now_served)
            self._evict(keep={now_served, wanted, self._previous})
            return changed

    def _hold(self, key: Key) -> bool:
        """Load ``key`` unless held (or failed before); True if it is held."""
        if key in self._loaded:
            return True
        if key in self._failed or key[1] is None:
            return False
        if _version_key(self.published_dir, key[0]) != key:
            return False  # that folder was replaced since: another key now
        started = time.perf_counter()
        try:
            version = PublishedVersion.load(
                self.published_dir, key[0], cold_start_pool=self.cold_start_pool
            )
        except Exception as error:  # noqa: BLE001 - keep serving the old version
            self._failed.add(key)
            VERSION_LOAD_FAILURES.inc()
            log.error(
                "cannot load published version %s (still serving %s): %s",
                key[0],
                self._serving[0] if self._serving else "none",
                one_line(error, limit=300),
            )
            return False
        VERSION_LOAD_SECONDS.observe(time.perf_counter() - started)
        self._loaded[key] = version
        return True

    def _announce(self) -> None:
        held = frozenset(self._loaded)
        if held != self._announced:
            self.pointer.announce(held)
            self._announced = held

    def _swapped(self, old: Key | None, new: Key) -> None:
        if old is not None and old[0] != new[0]:
            VERSION_INFO.labels(old[0]).set(0)
        VERSION_INFO.labels(new[0]).set(1)
        VERSION_SWAPS.inc()
        if old is not None and old[0] == new[0]:  # the same run id published again
            log.info("serving published version %s again: its files changed", new[0])
        else:  # INFO: a nightly event, not a problem (``server.log_config`` shows it)
            log.info("serving published version %s (was %s)", new[0], old[0] if old else "none")
        self._previous, self._serving = old, new

    def _evict(self, keep: set) -> None:
        """Drop versions not served, not wanted and not the previous one: withdrawn from the
        announcement first, then dropped unless the pointer moved to one meanwhile."""
        extra = [key for key in self._loaded if key not in keep]
        if not extra:
            return
        remaining = frozenset(self._loaded) - set(extra)
        self.pointer.announce(remaining)
        self._announced = remaining
        served = self.pointer.served()
        for key in extra:
            if key != served:
                del self._loaded[key]
        self._announce()

    def _catch_up(self, key: Key) -> PublishedVersion:
        """Load the served version now (a worker left behind by its peers)."""
        with self._lock:
            if self._hold(key):
                self._announce()
                return self._loaded[key]
        raise VersionUnavailableError(
            f"published version {key[0]} is served but this worker cannot load it"
        )

    def start(self) -> None:
        """Start the watcher thread (idempotent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="recs-version-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the watcher thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the watcher must survive anything
                log.exception("version watcher failed; retrying")
