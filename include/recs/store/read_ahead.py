"""A record-batch stream read ahead on a thread of its own (the snapshot's readers).

``ReadAhead(batches, depth)``: the driver fetches the next batches (C code, the GIL released)
while the caller converts the ones before. Used by ``recs.store.readers``; why, and what it
bought: ``bench/README.md``, "The night at scale".
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa


class ReadAhead:
    """An iterator over ``batches`` that a helper thread reads up to ``depth`` batches ahead,
    so the driver's fetching (C code, the GIL released) overlaps the conversion of the batches
    before them: the freeze of 50 M follow edges read them in 3/4 of the time
    (``bench/README.md``, "The night at scale"). The order is kept; an error of the driver is
    raised by ``__next__`` at the batch it failed on. ``close()`` stops the thread after the
    batch it is reading and waits for it, so the connection is idle once it returns; the
    reader calls it before any other use of its connection (``_AdbcReader._idle``)."""

    _END = object()

    def __init__(self, batches: Iterator[pa.RecordBatch], depth: int) -> None:
        self._slots: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=self._produce, args=(batches,), name="recs-store-read", daemon=True
        )
        self._thread.start()

    def _offer(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._slots.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, batches: Iterator[pa.RecordBatch]) -> None:
        try:
            for batch in batches:
                if not self._offer((batch, None)):
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, raised there
            self._offer((self._END, error))
        else:
            self._offer((self._END, None))

    def __iter__(self) -> ReadAhead:
        return self

    def __next__(self) -> pa.RecordBatch:
        if self._done:
            raise StopIteration
        item, error = self._slots.get()
        if item is self._END:
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop the thread (after the batch it is reading) and wait for it; idempotent."""
        self._done = True
        self._stop.set()
        self._thread.join()
