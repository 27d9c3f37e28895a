"""Run artifacts on storage every worker can reach: the run store (``RECS_RUN_STORE_URL``).

Every stage reads and writes its run's local folder ``<home>/runs/<date>/<run_id>/`` as it
always has. With a run store set, each task first *pulls* the artifacts it reads from the store
into that folder and, once it has succeeded, *pushes* what it wrote, so the tasks of one run may
run on machines that share no disk (Celery or Kubernetes workers; ARCHITECTURE §6: "storage
paths may be object-store URLs"). The store is a shared-volume path or any fsspec URL
(``s3://bucket/prefix``, ``file:///mnt/runs``, ``memory://`` in tests). Unset (the default),
nothing here runs: no copy, no import of fsspec, the same bytes as before.

The store mirrors the run folder, ``<store>/runs/<date>/<run_id>/<the same relative paths>``,
in *parts*, the outputs of one stage (``parts``: which stage reads and writes which):
``snapshot`` (freeze_snapshot), ``models`` (build_models:
``exports/`` and ``dbt/``), ``warehouse`` (its DuckDB file, read by dbt-docs only), ``dbt_docs``,
``graph`` (build_graph), ``shard_id=NNN`` (traverse_shard), ``gate_shard_id=NNN``
(validate_shard) and ``validation`` (validate_run, without the shards' results).

The contract, atomic from a reader's point of view:

- A part is trusted only through its marker ``.parts/<part>.json``, which ``push`` writes last:
  every file's relative path, size, sha256 and mtime (ns), and the part's ``checksum`` (sha256
  of the paths and digests; ``entries``). A stage withdraws the markers of what it writes when
  it starts (``forget``), as its local code removes its own manifests first (the freeze
  excepted: it swaps its snapshot in whole at its end, so one refused leaves the earlier
  attempt's usable; ``parts.stage_outputs``), and ``push``
  removes the marker before it uploads: a task or a push that dies half-way leaves no marker,
  so nothing a later task trusts.
- ``pull`` downloads the files of the marker a stage reads (``stage_inputs``) into a staging
  folder, checks each one's size and sha256 against the marker (a file replaced by a rerun while
  it was read fails with ``ArtifactNotFoundError``; the task's retry reads the new one), gives
  it the writer's mtime (so the gate's input fingerprints agree across machines) and moves it
  into place with ``os.replace``; local files of the pulled scope the marker does not list are
  removed (a failed shard is failed here too). A local file with the marker's size and mtime is
  taken as that file (the writer's own machine, or an earlier pull) and not downloaded again.
- The capped CSR graph is not pulled into the run folder: ``graph_cache`` copies it once per
  machine, keyed by run and checksum (``synced`` hands its folder to the traverse task, and
  holds it in use until the task ends).

The run and shard ``flock``s stay local (``locks.py``): across machines, Airflow runs one
instance of a task at a time. Retained snapshots are not run artifacts: they live under
``<home>/snapshots/`` and are copied whole to and from ``<store>/snapshots/<date>/`` by
``retained`` (``RunStore.run_root`` of a ``retained.RetainedFolder``). Published versions stay
under ``<home>/published/``; the store only records which one ``CURRENT`` names
(``RunStore.current``), so a gate that cannot see them errors.

Sources: fsspec's ``url_to_fs``, ``put``, ``get``, ``pipe_file``, ``cat_file``, ``mv``, ``rm``
(filesystem-spec.readthedocs.io, API reference); an object store replaces an object whole on
PUT and reads its own writes (Amazon S3's strong read-after-write consistency), so the marker
written last makes a part visible at once and never half.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from recs.config import get_settings
from recs.errors import ArtifactNotFoundError, RecsError, RunStoreError
from recs.files import read_json, staging_name
from recs.nightly.entries import (
    content_checksum,
    file_entry,
    local_files,
    same_content,
    same_file,
)
from recs.nightly.parts import (  # noqa: F401 - the parts, importable from here too
    DBT_DOCS,
    GRAPH,
    MODELS,
    PUSHED_ON_FAILURE,
    SNAPSHOT,
    SNAPSHOT_MANIFEST,
    VALIDATION,
    WAREHOUSE,
    Part,
    gate_part,
    shard_part,
    stage_inputs,
    stage_outputs,
)
from recs.nightly.runs import RunPaths
from recs.nightly.store_backends import (  # noqa: F401 - S3_CONFIG importable from here too
    S3_CALL_RETRIES,
    S3_CONFIG,
    file_url_path,
    first_line,
    modified_time,
    s3_options,
)

log = logging.getLogger("recs.nightly.artifacts")

MARKERS = ".parts"
"""The folder of a run in the store that holds its parts' markers."""
MARKER_FORMAT = 1
CURRENT = "published/CURRENT"
"""Where the store records the run id ``CURRENT`` names (the versions stay under ``home``)."""


class _Unread:
    """``RunStore.pull``'s default ``marker``: not read by the caller (None means "none")."""


class RunStore:
    """The run store at ``url`` (fsspec ``options``). Raises ``RunStoreError`` for a malformed
    URL or a protocol whose fsspec package is not installed (one line, naming the setting)."""

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        from fsspec.core import split_protocol, url_to_fs

        self.url = url
        options = dict(options or {})
        protocol = split_protocol(url)[0]
        if protocol in (None, "file", "local"):
            options.setdefault("auto_mkdir", True)  # a shared volume: make parent folders
        if protocol in ("s3", "s3a"):
            options = s3_options(options)
        if protocol not in (None, "file", "local", "memory") and url.split("://", 1)[1][:1] == "/":
            raise RunStoreError(
                f"unusable run store {url!r} (RECS_RUN_STORE_URL): the bucket must follow "
                f"'{protocol}://' directly ({protocol}://bucket/prefix), not a '/'"
            )
        if protocol == "file":
            url = f"file://{file_url_path(url)}"
        if protocol in (None, "local") and not Path(url.removeprefix("local://")).is_absolute():
            raise RunStoreError(
                f"unusable run store {url!r} (RECS_RUN_STORE_URL): a folder must be an absolute "
                "path (a relative one would be another folder in each task's working directory)"
            )
        try:
            self.fs, root = url_to_fs(url, **options)
        except (ValueError, ImportError, TypeError) as error:
            raise RunStoreError(
                f"unusable run store {url!r} (RECS_RUN_STORE_URL): {first_line(error)}"
            ) from None
        if protocol in ("s3", "s3a"):
            self.fs.retries = S3_CALL_RETRIES
        self.root = root.rstrip("/")
        if not self.root.strip("/"):
            raise RunStoreError(
                f"unusable run store {url!r} (RECS_RUN_STORE_URL): it names no bucket or folder"
            )
        self.local = protocol in (None, "file", "local")
        self.in_process = protocol == "memory"  # fsspec's memory filesystem (tests)

    def check(self) -> None:
        """One round trip, so an unreachable store fails the task at once with one line; and
        where the store is made must exist: its bucket, or for a folder its parent folder, so
        a bucket that does not exist, or a path whose parent is mistyped or not mounted, is an
        error rather than an empty store (or a folder made on this machine's own disk). A
        mistyped last folder, or a mount point left empty, cannot be told from a new store."""
        if self._io("reach it", self.fs.exists, self.root) or self.in_process:
            return
        if self.local:
            where = self.root.rsplit("/", 1)[0] or "/"  # the folder the store is made in
        else:  # the bucket
            where = ("/" if self.root.startswith("/") else "") + self.root.lstrip("/").split("/")[0]
        if where != self.root and self._io("reach it", self.fs.exists, where):
            if self.local and not self._io("reach it", self.fs.isdir, where):
                raise RunStoreError(f"run store {self.url}: {where} is a file, not a folder: "
                                    "correct RECS_RUN_STORE_URL")  # fmt: skip
            return
        raise RunStoreError(
            f"run store {self.url}: {where} does not exist: create the "
            f"{'folder (or mount the shared volume)' if self.local else 'bucket'}, or correct "
            "RECS_RUN_STORE_URL"
        )

    def _io(self, what: str, func, *args, missing_ok: bool = False):
        """``func(*args)``, its errors as one ``RunStoreError`` line (``FileNotFoundError``
        passes through when ``missing_ok``: an absent marker or file the caller handles; else,
        e.g. a bucket that does not exist, it is a store error too)."""
        try:
            return func(*args)
        except RecsError:
            raise
        except FileNotFoundError:
            if missing_ok:
                raise
            raise RunStoreError(
                f"run store {self.url}: cannot {what}: not found (does the bucket or folder exist?)"
            ) from None
        except Exception as error:  # noqa: BLE001 - any backend's error becomes one line
            raise RunStoreError(
                f"run store {self.url}: cannot {what}: {type(error).__name__}: {first_line(error)}"
            ) from error

    # --- where things are -----------------------------------------------------------------

    def run_root(self, paths: RunPaths) -> str:
        folder = getattr(paths, "store_folder", None)  # not a run: retained.RetainedFolder
        if folder is not None:
            return f"{self.root}/{folder}"
        return f"{self.root}/runs/{paths.snapshot_date.isoformat()}/{paths.run_id}"

    # --- the published pointer (``publish``, ``validation``) ---------------------------------

    def current(self) -> str | None:
        """The run id ``CURRENT`` named where it was last switched (``published/CURRENT`` in
        the store, rewritten by every switch), or None if it never was."""
        try:
            raw = self._io("read CURRENT", self.fs.cat_file, f"{self.root}/{CURRENT}",
                           missing_ok=True)  # fmt: skip
        except FileNotFoundError:
            return None
        return raw.decode().strip() or None

    def set_current(self, run_id: str) -> None:
        """Record the switch of ``CURRENT`` to ``run_id``: written aside, then moved over the
        record, so a reader sees the old name or the new one (as the markers). ``""`` records
        none (``switch._set_back`` undoing a first switch that failed)."""
        final = f"{self.root}/{CURRENT}"
        staged = f"{final.rsplit('/', 1)[0]}/{staging_name('CURRENT', '.tmp')}"
        self._io("write CURRENT", self.fs.pipe_file, staged, f"{run_id}\n".encode())
        self._io("write CURRENT", self.fs.mv, staged, final)

    # --- whole runs (``recs gc``: ``retention``) ---------------------------------------------

    def runs(self) -> list[tuple[str, str]]:
        """``(date folder, run_id)`` of every run in the store, sorted."""
        return sorted((date, run_id) for date in self.folders("runs")
                      for run_id in self.folders(f"runs/{date}"))  # fmt: skip

    def folders(self, relative: str) -> list[str]:
        """The names of the folders directly under ``relative`` (to the store's root)."""
        return self._io("list the runs", self._folders, f"{self.root}/{relative}")

    def _folders(self, path: str) -> list[str]:
        if not self.fs.exists(path):
            return []
        return [e["name"].rstrip("/").rsplit("/", 1)[-1]
                for e in self.fs.ls(path, detail=True) if e["type"] == "directory"]  # fmt: skip

    def last_changed(self, relative: str) -> float | None:
        """When an object under ``relative`` (a run's or a snapshot's folder) was last written to
        the store (epoch seconds, the store's own times: an upload in progress counts, markers or
        not); None when nothing is there. An object whose store gives no time counts as now."""
        path = f"{self.root}/{relative}"
        found = self._io("list", self.fs.find, path, None, False, True) if self._io(
            "look up", self.fs.exists, path) else {}  # fmt: skip
        return max((modified_time(info) for info in found.values()), default=None)

    def remove(self, relative: str) -> None:
        """Remove the folder ``relative`` (a run's, a retained snapshot's), markers first (a
        reader never trusts a half-removed part)."""
        root = f"{self.root}/{relative}"
        for path in (f"{root}/{MARKERS}", root):
            if self._io("look up", self.fs.exists, path):
                self._io(f"remove {relative}", self.fs.rm, path, True)

    def remote(self, paths: RunPaths, relative: str) -> str:
        return f"{self.run_root(paths)}/{relative}"

    def names(self, paths: RunPaths, relative: str) -> list[str]:
        """The names directly under the run's folder ``relative`` in the store (sorted; none if
        it is absent): one listing."""
        try:
            found = self._io(f"list {relative}", self.fs.ls, self.remote(paths, relative),
                             False, missing_ok=True)  # fmt: skip
        except FileNotFoundError:
            return []
        return sorted(str(path).rstrip("/").rsplit("/", 1)[-1] for path in found)

    def remove_files(self, paths: RunPaths, relatives: list[str], recursive: bool = False) -> None:
        """Remove the run's files (or with ``recursive`` folders) ``relatives`` (relative to its
        folder) in one request."""
        if relatives:
            targets = [self.remote(paths, relative) for relative in relatives]
            self._io(f"remove {', '.join(relatives[:3])}", self.fs.rm, targets, recursive)

    def _marker_path(self, paths: RunPaths, part: Part) -> str:
        return self.remote(paths, f"{MARKERS}/{part.name}.json")

    # --- markers ----------------------------------------------------------------------------

    def read(self, paths: RunPaths, relative: str) -> bytes | None:
        """The run's file ``relative`` in the store, or None if the store holds none."""
        try:
            return self._io(f"read {relative}", self.fs.cat_file, self.remote(paths, relative),
                            missing_ok=True)  # fmt: skip
        except FileNotFoundError:
            return None

    def marker(self, paths: RunPaths, part: Part) -> dict[str, Any] | None:
        """The part's marker, or None when the part is not complete in the store."""
        raw = self.read(paths, f"{MARKERS}/{part.name}.json")
        return None if raw is None else self._trusted(raw, part.name)

    def markers(self, paths: RunPaths, parts: list[Part]) -> dict[str, dict[str, Any] | None]:
        """``marker`` of each of ``parts``, by part name, read in one call (fsspec's ``cat`` of
        a list: concurrent on an object store)."""
        wanted = {self._marker_path(paths, part): part.name for part in parts}
        if not wanted:  # fsspec's cat of no path raises
            return {}
        read = self._io("read the markers", self.fs.cat, list(wanted), False, "return")
        found: dict[str, dict[str, Any] | None] = {}
        for path, name in wanted.items():
            raw = read.get(path, FileNotFoundError(path))
            if isinstance(raw, Exception) and not isinstance(raw, FileNotFoundError):
                raise RunStoreError(f"run store {self.url}: cannot read the marker of {name}: "
                                    f"{type(raw).__name__}: {first_line(raw)}")  # fmt: skip
            found[name] = None if isinstance(raw, Exception) else self._trusted(raw, name)
        return found

    def _trusted(self, raw: bytes, name: str) -> dict[str, Any] | None:
        try:
            document = json.loads(raw)
            assert document["format"] == MARKER_FORMAT and isinstance(document["files"], dict)
        except (ValueError, KeyError, TypeError, AssertionError):
            log.warning("run store %s: damaged marker of %s: not trusted", self.url, name)
            return None
        return document

    def forget(self, paths: RunPaths, part: Part) -> None:
        """Withdraw the part: its marker (its files stay until a push replaces them)."""
        marker = self._marker_path(paths, part)
        if self._io("look up", self.fs.exists, marker):
            self._io(f"remove {part.name}", self.fs.rm, marker)

    def _remote_sizes(self, paths: RunPaths, part: Part) -> dict[str, int | None]:
        """The part's files in the store: their sizes (bytes, None if the store gives none) by
        path relative to the run folder, sorted; from the listing, nothing is read."""
        prefix = self.run_root(paths) + "/"
        found: dict[str, int | None] = {}
        for root in part.roots:
            listed = self._io(
                f"list {part.name}", lambda where: self.fs.find(where, detail=True),
                self.remote(paths, root),
            )  # fmt: skip
            for path, info in listed.items():
                if path.startswith(prefix) and part.covers(path[len(prefix) :]):
                    found[path[len(prefix) :]] = info.get("size")
        return dict(sorted(found.items()))

    # --- push and pull ----------------------------------------------------------------------

    def push(
        self, paths: RunPaths, part: Part, previous: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Upload the part's local files (those unchanged since the last marker are kept:
        ``previous``, that marker's ``files``, or the marker in the store now, if the store's
        copy has the local size: a truncated one is uploaded again), remove the store's files
        of the part that are not local, then write the marker.
        Returns ``{"part", "files", "uploaded", "bytes", "checksum"}``."""
        local = local_files(paths.run_dir, part)
        entries = {relative: file_entry(path) for relative, path in local.items()}
        if previous is None:
            previous = (self.marker(paths, part) or {}).get("files", {})
        self.forget(paths, part)  # from here until the marker is back, the part is not trusted
        held = self._remote_sizes(paths, part)  # a file gone or cut short meanwhile
        upload = [r for r, entry in entries.items()
                  if held.get(r, -1) != entry["size"]
                  or not same_content(previous.get(r), entry)]  # fmt: skip
        if upload:
            self._io(
                f"upload {part.name}",
                self.fs.put,
                [str(local[r]) for r in upload],
                [self.remote(paths, r) for r in upload],
            )
        stale = [f"{self.run_root(paths)}/{r}" for r in sorted(set(held) - set(entries))]
        if stale:
            self._io(f"remove stale files of {part.name}", self.fs.rm, stale)
        document = {
            "format": MARKER_FORMAT,
            "part": part.name,
            "run_id": paths.run_id,
            "snapshot_date": paths.snapshot_date.isoformat(),
            "files": entries,
            "checksum": content_checksum(entries),
        }
        marker = self._marker_path(paths, part)
        staged = marker.rsplit("/", 1)[0] + "/" + staging_name(f"{part.name}.json", ".tmp")
        body = json.dumps(document, indent=1, sort_keys=True).encode()
        self._io(f"write the marker of {part.name}", self.fs.pipe_file, staged, body)
        self._io(f"write the marker of {part.name}", self.fs.mv, staged, marker)
        size = sum(entries[r]["size"] for r in upload)
        log.info(
            "run store %s: pushed %s of %s (%d files, %d uploaded, %d bytes)",
            self.url,
            part.name,
            paths.run_id,
            len(entries),
            len(upload),
            size,
        )
        return {
            "part": part.name,
            "files": len(entries),
            "uploaded": len(upload),
            "bytes": size,
            "checksum": document["checksum"],
        }

    def pull(
        self,
        paths: RunPaths,
        part: Part,
        include: Iterable[str] | None = None,
        *,
        required: bool = True,
        marker: dict[str, Any] | None | type[_Unread] = _Unread,
    ) -> dict[str, Any]:
        """Make the local files of ``part`` (of those matching the ``include`` globs, relative
        to the run folder, if given) equal to its marker's (module docstring; ``marker``: the
        one the caller just read, else it is read here). A part without marker raises
        ``ArtifactNotFoundError`` when ``required``, else its local files in scope are removed
        (a shard that failed). Returns ``{"part", "present", "files", "downloaded"}``."""
        patterns = tuple(include) if include is not None else None

        def in_scope(relative: str) -> bool:
            return part.covers(relative) and (
                patterns is None or any(fnmatch.fnmatchcase(relative, p) for p in patterns)
            )

        document = self.marker(paths, part) if marker is _Unread else marker
        if document is None and required:
            raise ArtifactNotFoundError(
                f"run {paths.run_id} of {paths.snapshot_date} has no complete {part.name} in the "
                f"run store {self.url}: the stage writing it has not succeeded there"
            )
        wanted = {r: e for r, e in (document or {}).get("files", {}).items() if in_scope(r)}
        missing = {r: e for r, e in wanted.items() if not same_file(paths.run_dir / r, e)}
        if missing:
            staging = paths.run_dir / staging_name("pull", ".partial")
            try:
                self.fetch(paths, missing, staging, part)
                for relative in missing:
                    target = paths.run_dir / relative
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staging / relative, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        for relative, path in local_files(paths.run_dir, part).items():
            if in_scope(relative) and relative not in wanted:
                path.unlink(missing_ok=True)
        return {
            "part": part.name,
            "present": document is not None,
            "files": len(wanted),
            "downloaded": len(missing),
        }

    def fetch(
        self,
        paths: RunPaths,
        entries: dict[str, dict],
        folder: Path,
        part: Part,
        rewrite: str | None = None,
    ) -> None:
        """Download the files ``entries`` names (marker entries of ``part``, by relative path)
        to ``folder/<relative path>``, each checked against its size and sha256 and given its
        recorded mtime. Raises ``ArtifactNotFoundError`` for a file missing or changed; its
        message says how to mend a stored copy that stays damaged: remove the marker, then
        ``rewrite`` (what pushes the part again; default: rerun the stage that writes it)."""
        names = sorted(entries)
        targets = [folder / relative for relative in names]
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._io(
                "download",
                self.fs.get,
                [self.remote(paths, r) for r in names],
                [str(t) for t in targets],
                missing_ok=True,
            )
        except FileNotFoundError as error:
            raise ArtifactNotFoundError(
                f"run store {self.url}: a file of run {paths.run_id} went missing while it was "
                f"read ({first_line(error)}): retry"
            ) from None
        for relative, target in zip(names, targets, strict=True):
            entry = entries[relative]
            if not target.is_file() or file_entry(target, mtime=False) != {
                "size": entry["size"],
                "sha256": entry["sha256"],
            }:
                raise ArtifactNotFoundError(
                    f"run store {self.url}: {self.remote(paths, relative)} is not the file its "
                    "marker names (rewritten while it was read?): retry; if a retry fails the "
                    "same way, the stored copy is damaged: remove the marker "
                    f"{self._marker_path(paths, part)}, then "
                    f"{rewrite or f'rerun the stage that writes {part.name}'}, which uploads "
                    "every file again"
                )
            os.utime(target, ns=(entry["mtime_ns"], entry["mtime_ns"]))


@lru_cache(maxsize=4)
def _open(url: str, options_json: str) -> RunStore:
    store = RunStore(url, json.loads(options_json))
    store.check()
    return store


def run_store() -> RunStore | None:
    """The process's run store (``Settings.run_store_url`` and ``run_store_options``), or None
    when none is set. Raises ``RunStoreError`` (malformed or unreachable)."""
    return store_for(get_settings())


def store_for(settings) -> RunStore | None:
    """The run store of ``settings`` (a ``Settings``), or None when none is set."""
    if not settings.run_store_url:
        return None
    return _open(settings.run_store_url, json.dumps(settings.run_store_options, sort_keys=True))


def find_run(home: Path, snapshot_date, run_id: str | None = None) -> RunPaths:
    """``RunPaths.find``, first pulling the run's snapshot manifest from the run store when one
    is set, a run id is given and the store holds that run (a machine that has not seen it yet:
    ``recs shard run``, ``recs validate``, ``recs publish``). Raises as ``RunPaths.find``."""
    store = run_store()
    if store is not None and run_id is not None:
        paths = RunPaths.create(home, snapshot_date, run_id)
        if store.marker(paths, SNAPSHOT) is not None:
            store.pull(paths, SNAPSHOT, SNAPSHOT_MANIFEST)
    return RunPaths.find(home, snapshot_date, run_id)


# --- what each stage reads and writes ----------------------------------------------------------

@dataclass(frozen=True)
class Synced:
    """What ``synced`` hands the stage: the local folder of the run's graph (the machine's
    cached copy) for ``traverse_shard`` with a run store, else None (``paths.graph_dir``)."""

    graph_dir: Path | None = None


@contextmanager
def synced(paths: RunPaths, stage: str, shard_id: int | None = None) -> Iterator[Synced]:
    """Run ``stage``'s body between a pull of what it reads and a push of what it writes
    (module docstring); without a run store, a no-op. Raises ``RunStoreError`` and
    ``ArtifactNotFoundError`` (the inputs the store does not hold complete, all named before
    any download; or a file changed while it was read)."""
    store = run_store()
    if store is None:
        yield Synced()
        return
    writes, withdraws = stage_outputs(stage, shard_id)
    # what the store held before this attempt: its unchanged files need no upload again
    known = {part.name: (store.marker(paths, part) or {}).get("files", {}) for part in writes}
    for part in withdraws:
        store.forget(paths, part)
    with ExitStack() as in_use:
        graph_dir = None
        if stage != "freeze_snapshot":
            store.pull(paths, SNAPSHOT, SNAPSHOT_MANIFEST)
            shard_count = int(read_json(paths.snapshot_manifest)["settings"]["shard_count"])
            inputs = stage_inputs(stage, shard_id, shard_count)
            markers = {part.name: store.marker(paths, part) for part, _, _ in inputs}
            absent = [p.name for p, _, required in inputs if required and not markers[p.name]]
            if absent:  # all named, before any download (the assembly reads P pieces)
                named = ", ".join(absent[:10]) + (f" ({len(absent)} in all)" if absent[10:] else "")
                writers = "stages writing them have" if absent[1:] else "stage writing it has"
                raise ArtifactNotFoundError(
                    f"run {paths.run_id} of {paths.snapshot_date} has no complete {named} in "
                    f"the run store {store.url}: the {writers} not succeeded there"
                )
            for part, include, required in inputs:
                store.pull(paths, part, include, required=required, marker=markers[part.name])
            if stage == "traverse_shard":  # the machine's copy, in use until the stage ends
                from recs.nightly.graph_cache import local_graph

                graph_dir = in_use.enter_context(local_graph(store, paths)).graph_dir
        try:
            yield Synced(graph_dir)
        except BaseException:
            if stage in PUSHED_ON_FAILURE:
                for part in writes:
                    try:
                        store.push(paths, part, previous=known[part.name])
                    except Exception as error:  # noqa: BLE001 - the stage's own error counts
                        log.warning("run store: could not push %s: %s", part.name, error)
            raise
        for part in writes:
            store.push(paths, part, previous=known[part.name])
