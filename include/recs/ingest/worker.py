"""The parser process: large JSON Lines files are parsed on another core while this one writes.

``batches_from_worker`` starts ``python -c "...parse_worker_main()"`` (a plain child, not
``multiprocessing``: nothing of the caller's ``__main__`` is re-imported), which reads the file,
prepares each batch (``recs.ingest.batch.prepare_batch``) and, on SQLite, reads the next
batch's state ahead on its own read-only connection, then sends batches back pickled. The
parent acknowledges each batch once the one before it committed, so a state read ahead is at
most one batch old (``recs.ingest.resolution`` brings it up to date, or reads again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recs.errors import RecsError
from recs.ingest.batch import PreparedBatch, prepare_batch
from recs.ingest.events import Event, Quarantined, TimeWindow, line_text
from recs.ingest.readers import read_events
from recs.ingest.session import USER_PRIVACY, StoreSession


def prepared_batches(
    path: Path, batch_events: int, backend: str, window: TimeWindow, *, offsets: bool = False
) -> Iterator[PreparedBatch]:
    pending: list[Event | Quarantined] = []
    for item in read_events(path, window, offsets=offsets):
        pending.append(item)
        if len(pending) >= batch_events:
            yield prepare_batch(pending, backend)
            pending = []
    if pending:
        yield prepare_batch(pending, backend)


def parse_worker_main() -> None:
    """Entry point of the parser process (``batches_from_worker``). ``argv``: path, batch size,
    store backend, the ``TimeWindow`` (``lowest,highest,now`` in µs) and, to read ahead, the
    SQLite store URL. Writes one pickled ``("batch",
    PreparedBatch, state)`` per batch to stdout, then ``("done", None, None)`` (or ``("error",
    message, None)``). With a URL, ``state`` is ``StoreSession.load_state`` of the batch, read
    on a read-only connection once the parent acknowledged (one byte on stdin) the batch
    before: by then every batch before that one has committed."""
    import gc
    import pickle
    import sys

    gc.disable()  # short-lived and allocation-heavy: the cyclic collector only costs time
    out = sys.stdout.buffer
    path, batch_events, backend = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    window = TimeWindow(*(int(bound) for bound in sys.argv[4].split(",")))
    url = sys.argv[5] if len(sys.argv) > 5 else ""
    reader = StoreSession(url, read_only=True) if url else None
    try:
        batches = prepared_batches(path, batch_events, backend, window, offsets=True)
        for number, prepared in enumerate(batches):
            state = None
            if reader is not None:
                if number and sys.stdin.buffer.read(1) != b"1":
                    return  # the parent went away
                reader.begin(write=False)
                try:
                    state = reader.load_batch_state(prepared)
                finally:
                    reader.rollback()
                # Only upserted users need their whole row; for the others existence and
                # privacy, as one of two shared tuples (pickled once each: 3x less to send).
                state["users"] = {
                    user: row if user in prepared.upserted else USER_PRIVACY[row[4]]
                    for user, row in state["users"].items()
                }
            # Plain tuples unpickle 3.5x faster than named ones; the batch code indexes them.
            plain = prepared._replace(
                events=[tuple(event) for event in prepared.events],
                later={key: [tuple(c) for c in copies] for key, copies in prepared.later.items()},
            )
            pickle.dump(("batch", plain, state), out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
        pickle.dump(("done", None, None), out)
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises
        pickle.dump(("error", f"{type(error).__name__}: {error}", None), out)
    finally:
        out.flush()
        if reader is not None:
            reader.close()


def batches_from_worker(
    path: Path, batch_events: int, backend: str, window: TimeWindow, read_ahead_url: str | None
) -> Iterator[tuple[PreparedBatch, dict[str, Any] | None]]:
    """``prepared_batches`` computed by a parser process, so parsing (and, for SQLite, reading the
    next batch's state) runs on another core while this process applies the previous batch.
    A plain ``python -c`` child (not ``multiprocessing``): nothing of the caller's
    ``__main__`` is re-imported. Yields ``(batch, state read ahead or None)``."""
    import pickle
    import subprocess
    import sys
    import tempfile

    errors = tempfile.TemporaryFile()  # a file, not a pipe: a chatty child never blocks on it
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from recs.ingest.worker import parse_worker_main; parse_worker_main()",
            str(path),
            str(batch_events),
            backend,
            ",".join(str(bound) for bound in window),
            *([read_ahead_url] if read_ahead_url else []),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
    )
    assert worker.stdout is not None and worker.stdin is not None
    try:
        while True:
            try:
                kind, payload, state = pickle.load(worker.stdout)
            except EOFError:
                worker.wait(timeout=30)
                errors.seek(0)
                detail = errors.read().decode(errors="replace").strip()[-500:]
                raise RecsError(f"the parser process for {path} died: {detail}") from None
            if kind == "done":
                return
            if kind == "error":
                raise RecsError(f"parsing {path} failed: {payload}")
            if read_ahead_url:  # every batch before this one has committed
                with contextlib.suppress(BrokenPipeError):  # after its last batch it may exit
                    worker.stdin.write(b"1")
                    worker.stdin.flush()
            yield payload, state
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait(timeout=30)
        for stream in (worker.stdin, worker.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        errors.close()


class LineAt:
    """The original line at a byte offset of a JSON Lines file (for late quarantines)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, offset: int) -> str:
        with open(self.path, "rb") as handle:
            handle.seek(offset)
            return line_text(handle.readline())
